"""migrate-cohdi: CoHDI ComposabilityRequests become ours, or are refused with every reason."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import composable_dra_cli as cli
from api.v1alpha1 import API_VERSION, ComposabilityRequestSpec
from composable_dra.commands import safe_yaml
from composable_dra.commands.cohdi import MigrationError, convert, convert_all


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


def _bomb(levels: int) -> str:
    """Billion laughs: each anchor aliased nine times by the next (600 bytes at 9 levels)."""
    lines = ["lol:", '  a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    request = yaml.safe_dump(cohdi()).replace("type: gpu", f"type: *a{levels}")
    return "\n".join(lines) + "\n" + request


def test_an_alias_bomb_is_refused_before_it_expands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25.12: PyYAML shares what aliases name, and the refusal's repr of ``type``
    expanded it (9 levels: gigabytes, MemoryError). Aliases are refused instead; 7 levels
    keep the old behaviour cheap enough to see it fail."""
    src = tmp_path / "bomb.yaml"
    src.write_text(_bomb(7))
    assert cli.main(["migrate-cohdi", str(src), "--fabric", "fsas"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "aliases" in err and len(err) < 1000


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("kind: List\nitems: 5\n", "items is not a list"),
        (yaml.safe_dump({**cohdi(), "metadata": ["req"]}), "metadata"),
        (yaml.safe_dump({**cohdi(), "metadata": {"name": 5}}), "metadata.name"),
        (yaml.safe_dump({**cohdi(), "spec": "gpu"}), "spec"),
        (yaml.safe_dump({**cohdi(), "spec": {"resource": ["gpu"]}}), "spec.resource"),
        (yaml.safe_dump({**cohdi(), "spec": None}), "spec"),
        (yaml.safe_dump(cohdi(model=["a"])), "spec.resource.model"),
        (yaml.safe_dump(cohdi(size="2")), "spec.resource.size"),
        (yaml.safe_dump(cohdi(other_spec=[1])), "spec.resource.other_spec"),
        (yaml.safe_dump({**cohdi(), "metadata": {"name": "r", "labels": ["a"]}}), "labels"),
        (yaml.safe_dump({**cohdi(), "metadata": {"name": "r", "labels": {"a": 1}}}), "labels.a"),
    ],
)
def test_a_wrongly_shaped_document_is_refused_with_where(
    text: str, why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25.12: these ended in a traceback (AttributeError, TypeError)."""
    src = tmp_path / "cohdi.yaml"
    src.write_text(text)
    assert cli.main(["migrate-cohdi", str(src), "--fabric", "fsas"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and why in err and "Traceback" not in err


def test_yaml_nested_past_the_parsers_recursion_is_not_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "deep.yaml"
    src.write_text("[" * 5000)
    assert cli.main(["migrate-cohdi", str(src), "--fabric", "fsas"]) == 2
    assert "nests too deeply" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ({"Bad Key": "x"}, "label key 'Bad Key'"),
        ({"team": "a b"}, "label value 'a b'"),
        ({"team": "x" * 64}, "label value"),
        ({"Example.com/team": "a"}, "prefix"),
        ({"team": "-a"}, "label value '-a'"),
    ],
)
def test_labels_that_are_not_kubernetes_labels_are_refused(
    labels: dict[str, str], why: str
) -> None:
    """Issue 25.12: they were copied as they came, for the API server to refuse later."""
    doc = {**cohdi(), "metadata": {"name": "req", "labels": labels}}
    with pytest.raises(MigrationError, match=r"metadata\.labels") as refused:
        convert(doc, "fsas")
    assert why in "\n".join(refused.value.reasons)


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=16,
)
_fields = st.sampled_from(["metadata", "spec", "resource", "labels", "name", "type", "size"])
_shaped = st.builds(
    lambda doc, field, value: {**doc, field: value} if field in doc else doc,
    st.just(cohdi()),
    _fields,
    _json,
)


@settings(max_examples=300)
@given(docs=st.lists(st.one_of(_json, _shaped, st.builds(cohdi, resource=_json)), max_size=3))
def test_fuzz_convert_all(docs: list[Any]) -> None:
    """Any documents: ours, each valid, or a MigrationError."""
    try:
        converted = convert_all(docs, "fsas")
    except MigrationError as exc:
        assert exc.reasons and all(isinstance(r, str) for r in exc.reasons)
        return
    for ours in converted:
        ComposabilityRequestSpec.model_validate(ours["spec"])


@settings(max_examples=300)
@given(text=st.text(alphabet=st.sampled_from("ab:-&*[]{},!\n '\"#|>?"), max_size=40))
def test_fuzz_the_yaml_reader(text: str) -> None:
    """Any text: documents without aliases, or a yaml.YAMLError."""
    with contextlib.suppress(yaml.YAMLError):
        assert isinstance(safe_yaml.load_all(text), list)
