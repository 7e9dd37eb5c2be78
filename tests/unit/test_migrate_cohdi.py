"""migrate-cohdi: CoHDI ComposabilityRequests become ours, or are refused with every reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from api.v1alpha1 import API_VERSION, ComposabilityRequestSpec
from composable_dra import cli
from composable_dra.migrate_cohdi import MigrationError, convert, convert_all


def cohdi(name: str = "req", **resource: Any) -> dict[str, Any]:
    base = {"type": "gpu", "model": "NVIDIA-A100-PCIE-40GB", "size": 2, "target_node": "node1"}
    return {
        "apiVersion": "cro.hpsys.ibm.ie.com/v1alpha1",
        "kind": "ComposabilityRequest",
        "metadata": {"name": name, "labels": {"team": "a"}},
        "spec": {"resource": {**base, **resource}},
        "status": {"state": "Online"},
    }


def test_samenode_with_target_node_maps_field_by_field() -> None:
    ours = convert(cohdi(allocation_policy="samenode"), "fsas")
    assert ours == {
        "apiVersion": API_VERSION,
        "kind": "ComposabilityRequest",
        "metadata": {"name": "req", "labels": {"team": "a"}},
        "spec": {
            "fabric": "fsas",
            "model": "NVIDIA-A100-PCIE-40GB",
            "size": 2,
            "targetNode": "node1",
        },
    }
    ComposabilityRequestSpec.model_validate(ours["spec"])
    # allocation_policy defaults to samenode in CoHDI's schema
    assert convert(cohdi(), "fsas") == ours


def test_cohdi_example_is_refused_with_every_reason() -> None:
    """CoHDI's own example (examples/_v1_gpu_composabilityrequest.yaml) asks for more."""
    doc = cohdi(
        force_detach=True,
        allocation_policy="samenode",
        other_spec={"milli_cpu": 2, "memory": 40, "ephemeral_storage": 2, "allowed_pod_number": 5},
    )
    with pytest.raises(MigrationError) as refused:
        convert(doc, "fsas")
    text = "\n".join(refused.value.reasons)
    assert len(refused.value.reasons) == 2
    assert "force_detach" in text and "other_spec" in text


@pytest.mark.parametrize(
    ("resource", "why"),
    [
        ({"type": "cxlmemory"}, "GPUs only"),
        ({"type": "fpga"}, "neither gpu nor cxlmemory"),
        ({"allocation_policy": "samenode", "target_node": ""}, "samenode without target_node"),
        ({"allocation_policy": "differentnode", "target_node": ""}, "--spread"),
        ({"size": -1}, "size"),
        ({"size": 5000}, "size"),
        ({"size": True}, "size"),
        ({"model": ""}, "model is required"),
        ({"target_node": "Not_A_Node"}, "target_node"),
        ({"gpus_per_pod": 2}, "unknown field"),
    ],
)
def test_what_we_cannot_honour_is_refused(resource: dict[str, Any], why: str) -> None:
    with pytest.raises(MigrationError, match=why.replace("-", r"\-")):
        convert(cohdi(**resource), "fsas")


def test_differentnode_with_spread_becomes_a_cluster_wide_request() -> None:
    ours = convert(cohdi(allocation_policy="differentnode", target_node=""), "f", spread=True)
    assert "targetNode" not in ours["spec"] and ours["spec"]["size"] == 2


def test_other_kinds_are_refused() -> None:
    resource = {**cohdi(), "kind": "ComposableResource"}
    with pytest.raises(MigrationError, match="creates those for a request"):
        convert(resource, "f")
    with pytest.raises(MigrationError, match="not a CoHDI"):
        convert({**cohdi(), "apiVersion": API_VERSION}, "f")


def test_a_list_converts_all_or_nothing() -> None:
    good, bad = cohdi("a"), cohdi("b", type="cxlmemory")
    assert [
        r["metadata"]["name"] for r in convert_all([{"kind": "List", "items": [good]}], "f")
    ] == ["a"]
    with pytest.raises(MigrationError) as refused:
        convert_all([{"kind": "List", "items": [good, bad]}], "f")
    assert refused.value.reasons == [
        "ComposabilityRequest b: type cxlmemory: this suite attaches GPUs only"
    ]
    with pytest.raises(MigrationError, match="no ComposabilityRequest"):
        convert_all([None], "f")


def test_cli_writes_ours_or_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, out = tmp_path / "cohdi.yaml", tmp_path / "ours.yaml"
    src.write_text(yaml.safe_dump_all([cohdi("a"), cohdi("b", target_node="node2")]))
    assert cli.main(["migrate-cohdi", str(src), "--fabric", "fsas", "-o", str(out)]) == 0
    written = list(yaml.safe_load_all(out.read_text()))
    assert [(r["metadata"]["name"], r["spec"]["targetNode"]) for r in written] == [
        ("a", "node1"),
        ("b", "node2"),
    ]
    out.unlink()
    src.write_text(yaml.safe_dump_all([cohdi("a"), cohdi("c", type="cxlmemory")]))
    assert cli.main(["migrate-cohdi", str(src), "--fabric", "fsas", "-o", str(out)]) == 1
    assert not out.exists()
    assert "cxlmemory" in capsys.readouterr().err
    src.write_text("a: [unclosed")
    assert cli.main(["migrate-cohdi", str(src), "--fabric", "fsas"]) == 2
    assert "not YAML" in capsys.readouterr().err
    assert cli.main(["migrate-cohdi", str(tmp_path / "missing.yaml"), "--fabric", "fsas"]) == 2
