from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from api import crdgen
from api.v1alpha1 import KINDS, ComposableResourceSpec, FabricSpec

ROOT = Path(__file__).resolve().parents[2]


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
