from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from api import crdgen
from api.v1alpha1 import KINDS, ComposableResourceSpec, FabricSpec

ROOT = Path(__file__).resolve().parents[3]


def test_committed_crds_are_current(tmp_path: Path) -> None:
    crdgen.main([str(tmp_path)])
    generated = sorted(p.name for p in tmp_path.iterdir())
    committed = sorted(p.name for p in (ROOT / "deploy/crds").glob("*.yaml"))
    assert generated == committed
    for name in generated:
        assert (tmp_path / name).read_text() == (ROOT / "deploy/crds" / name).read_text(), (
            f"deploy/crds/{name} is stale: run `python -m api.crdgen`"
        )


def test_schema_is_structural() -> None:
    for kind in KINDS:
        text = crdgen.render(kind)
        for banned in ("anyOf", "$ref", "title", "null"):
            assert banned not in text, (kind.kind, banned)


def test_models_read_camel_case_objects() -> None:
    spec = ComposableResourceSpec.model_validate(
        {"fabric": "f", "deviceID": "blk-1", "targetNode": "n1", "forceDetach": True}
    )
    assert (spec.device_id, spec.target_node, spec.force_detach) == ("blk-1", "n1", True)
    fabric = FabricSpec.model_validate(
        {
            "backend": "redfish-composition",
            "endpoint": "https://fm:8443",
            "credentialsSecret": {"name": "fm", "namespace": "ops"},
        }
    )
    assert fabric.node_mapping.by == "systemUUID"
    assert fabric.insecure_skip_tls_verify is False
    with pytest.raises(ValidationError):
        FabricSpec.model_validate({"backend": "vendor-x", "endpoint": "https://fm"})


@pytest.mark.parametrize(
    "device_id",
    ["../../Systems/node-1", "..", ".", "a/b", "gpu-1?x=1", "gpu#1", "g 1", "g\n", "%2e"],
)
def test_device_ids_are_one_url_segment(device_id: str) -> None:
    with pytest.raises(ValidationError, match="deviceID"):
        ComposableResourceSpec.model_validate(
            {"fabric": "f", "deviceID": device_id, "targetNode": "n1"}
        )


@pytest.mark.parametrize("device_id", ["gpu-1", "Block_7", "blk.1", "1:2", "-x"])
def test_ordinary_device_ids_pass(device_id: str) -> None:
    spec = ComposableResourceSpec.model_validate(
        {"fabric": "f", "deviceID": device_id, "targetNode": "n1"}
    )
    assert spec.device_id == device_id


def _fabric(endpoint: str) -> FabricSpec:
    return FabricSpec.model_validate(
        {
            "backend": "redfish-composition",
            "endpoint": endpoint,
            "credentialsSecret": {"name": "fm", "namespace": "ops"},
        }
    )


@pytest.mark.parametrize(
    "endpoint",
    ["https://admin:secret@fm:8443", "http://token@fm", "https://a:b@c@fm/", "HTTPS://u:p@fm"],
)
def test_fabric_endpoints_carry_no_credentials(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="must not carry credentials"):
        _fabric(endpoint)


@pytest.mark.parametrize(
    "endpoint",
    ["https://fm.example:8443", "http://10.0.0.1/redfish", "https://fm/a@b", "https://[::1]:8443"],
)
def test_ordinary_fabric_endpoints_pass(endpoint: str) -> None:
    assert _fabric(endpoint).endpoint == endpoint
