"""The feature-detection decisions (composable_dra/k8s/features.py): what a probe's answer
shows, what a component refuses and how the refusal names the missing feature; the
answers come from the API server, so their readers are fuzzed."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.k8s import features as f
from composable_dra.k8s.features import ApiFeatures, Feature

DRIVER = "gpu.composable.dra.io"


def found(present: set[Feature], probed: set[Feature] | None = None) -> ApiFeatures:
    probed = set(Feature) if probed is None else probed
    why = {k: f"{k.value} was dropped" for k in probed - present}
    return ApiFeatures(("v1", "v1beta2"), frozenset(probed), frozenset(present), why)


def test_the_slice_probe_answered_unchanged_shows_both_fields() -> None:
    body = f.slice_probe(DRIVER, "node-a", {"nodeName": "node-a"})
    assert body["spec"]["nodeName"] == "node-a" and body["spec"]["pool"]["name"] == "node-a"
    assert f.slice_features(body) == {
        Feature.BINDING_CONDITIONS: True,
        Feature.DEVICE_TAINTS: True,
    }


def test_a_dropped_field_is_an_absent_feature() -> None:
    body = f.slice_probe(DRIVER, "pool", {"allNodes": True})
    for field, feature in (
        ("bindingConditions", Feature.BINDING_CONDITIONS),
        ("bindsToNode", Feature.BINDING_CONDITIONS),
        ("taints", Feature.DEVICE_TAINTS),
    ):
        answer = copy.deepcopy(body)
        del answer["spec"]["devices"][0][field]
        kept = f.slice_features(answer)
        assert kept[feature] is False
        assert all(v for k, v in kept.items() if k != feature)


def test_partitionable_devices_need_the_selection_the_node_and_the_counters() -> None:
    body = f.partition_probe(DRIVER, "donor")
    assert body["spec"]["pool"]["name"] == "donor"  # the plugin's admission policy
    assert f.partition_kept(body, "donor")
    assert not f.partition_kept(body, "other")
    for drop in ("perDeviceNodeSelection", "nodeName", "consumesCounters"):
        answer = copy.deepcopy(body)
        (answer["spec"] if drop == "perDeviceNodeSelection" else answer["spec"]["devices"][0]).pop(
            drop
        )
        assert not f.partition_kept(answer, "donor"), drop
    assert not f.partition_kept(None, "donor")  # refused (422 once the gate dropped it)


def test_a_taint_rule_counts_only_with_its_taint() -> None:
    body = f.taint_rule_probe(DRIVER)
    assert f.taint_rule_kept(body)
    del body["spec"]["taint"]
    assert not f.taint_rule_kept(body)
    assert not f.taint_rule_kept(None)


def test_discovery_lists_the_group_versions() -> None:
    group = {"versions": [{"version": "v1"}, {"version": "v1beta2"}, "junk", {"version": 3}]}
    assert f.served_versions(group) == ("v1", "v1beta2")
    assert f.served_versions(None) == ()
    assert f.served_versions({"versions": "v1"}) == ()


def test_lending_is_refused_naming_each_missing_gate() -> None:
    v135 = found({Feature.RESOURCE_V1})
    refused = f.refusal(v135, ["the suite", "lending (--lend)"])
    assert refused is not None
    text = str(refused)
    assert text.startswith("lending (--lend) needs what this API server does not serve")
    assert "DRAPartitionableDevices" in text and "DRADeviceBindingConditions" in text
    assert "partitionable-devices was dropped" in text  # why the probe found it absent
    assert "DRADeviceTaints" not in text  # lending does not need it


def test_a_server_with_what_lending_needs_refuses_nothing() -> None:
    v136 = found(set(Feature) - {Feature.DEVICE_TAINT_RULES})
    assert f.refusal(v136, ["the suite", "lending (--lend)"]) is None


def test_without_resource_v1_everything_is_refused_first() -> None:
    refused = f.refusal(found(set()), ["the suite", "lending (--lend)"])
    assert refused is not None and str(refused).startswith("the suite needs")
    assert "resource.k8s.io/v1" in str(refused)


def test_missing_keeps_declaration_order_and_only_what_was_asked() -> None:
    v135 = found({Feature.RESOURCE_V1})
    assert v135.missing([Feature.DEVICE_TAINT_RULES, Feature.BINDING_CONDITIONS]) == [
        Feature.BINDING_CONDITIONS,
        Feature.DEVICE_TAINT_RULES,
    ]
    assert v135.missing([Feature.RESOURCE_V1]) == []


def test_the_gauge_and_the_log_line_cover_only_what_was_probed() -> None:
    scaler = found({Feature.RESOURCE_V1}, {Feature.RESOURCE_V1, Feature.DEVICE_TAINT_RULES})
    assert scaler.gauge() == {"resource-v1": 1, "device-taint-rules": 0}
    assert scaler.summary() == {
        "resource_versions": "v1,v1beta2",
        "uses": "resource-v1",
        "missing": "device-taint-rules",
    }


def test_every_feature_is_described() -> None:
    assert set(f.ABOUT) == set(Feature)
    assert all(use_needs for use_needs in f.NEEDS.values())


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
ANSWER = st.fixed_dictionaries(
    {
        "spec": st.fixed_dictionaries(
            {"devices": st.lists(st.dictionaries(st.text(max_size=24), JSON), max_size=3)},
            optional={"perDeviceNodeSelection": JSON, "taint": JSON},
        )
    }
)


@settings(max_examples=300)
@given(st.one_of(JSON, ANSWER))
def test_any_answer_reads_as_present_or_absent(answer: Any) -> None:
    assert set(f.slice_features(answer).values()) <= {True, False}
    assert f.partition_kept(answer, "donor") in (True, False)
    assert f.taint_rule_kept(answer) in (True, False)
    assert isinstance(f.served_versions(answer), tuple)
