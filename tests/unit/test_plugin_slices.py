"""The node's ResourceSlices: desired state and the plan that reaches it."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.quantity import format_bytes, parse_bytes
from dra_driver.slices import desired_slices, plan_slices, same_slice
from tests.unit.plugin_fixtures import DRIVER, NODE, gpu

UID = "0b7c1f3e-node-uid"


def test_attributes_capacity_and_owner() -> None:
    dev = gpu(0, pci_bus_id="0000:3b:00.0")
    (s,) = desired_slices(NODE, UID, DRIVER, [dev], generation=1)
    assert s["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": UID,
        "controller": True,
    }
    assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER
    (d,) = s["spec"]["devices"]
    assert d["name"] == "gpu-0"
    assert d["attributes"] == {
        "uuid": {"string": dev.uuid},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "model": {"string": "A100"},
        "attachment": {"string": "local"},
        "pciBusID": {"string": "0000:3b:00.0"},
    }
    assert d["capacity"] == {"memory": {"value": "80Gi"}}


def test_at_most_128_devices_a_slice_and_count_right() -> None:
    devices = [gpu(i) for i in range(300)]
    slices = desired_slices(NODE, UID, DRIVER, devices, generation=4)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {4}
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert sorted(names) == sorted(d.name for d in devices)
    assert len({s["metadata"]["name"] for s in slices}) == 3


def test_no_devices_still_one_empty_slice() -> None:
    (s,) = desired_slices(NODE, UID, DRIVER, [], generation=1)
    assert s["spec"]["devices"] == []


def _as_server_returns(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server sends back: extra fields, defaults, canonical quantities."""
    out = copy.deepcopy(obj)
    out["metadata"].update(resourceVersion="42", uid="x", creationTimestamp="2026-01-01T00:00:00Z")
    out["metadata"]["managedFields"] = [{"manager": "composable-dra-plugin"}]
    for dev in out["spec"]["devices"]:
        dev["capacity"]["memory"]["value"] = str(parse_bytes(dev["capacity"]["memory"]["value"]))
        dev["someFieldAddedLater"] = {"x": 1}
    if not out["spec"]["devices"]:
        del out["spec"]["devices"]  # omitempty
    out["spec"]["perDeviceNodeSelection"] = None
    return out


def test_first_publish_is_generation_one() -> None:
    plan = plan_slices(NODE, UID, DRIVER, [gpu(0)], observed=[])
    assert plan.generation == 1
    assert len(plan.apply) == 1 and plan.delete == []


def test_no_update_when_server_added_or_reformatted_fields() -> None:
    devices = [gpu(i) for i in range(3)]
    observed = [_as_server_returns(s) for s in desired_slices(NODE, UID, DRIVER, devices, 7)]
    plan = plan_slices(NODE, UID, DRIVER, devices, observed, last_generation=7)
    assert plan.empty and plan.generation == 7
    empty_obs = [_as_server_returns(s) for s in desired_slices(NODE, UID, DRIVER, [], 2)]
    assert plan_slices(NODE, UID, DRIVER, [], empty_obs).empty


def test_change_bumps_generation_of_every_slice() -> None:
    devices = [gpu(i) for i in range(130)]
    observed = [_as_server_returns(s) for s in desired_slices(NODE, UID, DRIVER, devices, 3)]
    plan = plan_slices(NODE, UID, DRIVER, [*devices, gpu(999)], observed)
    assert plan.generation == 4
    assert len(plan.apply) == 2
    assert {s["spec"]["pool"]["generation"] for s in plan.apply} == {4}


def test_deleted_slice_comes_back_and_obsolete_slices_go() -> None:
    devices = [gpu(i) for i in range(200)]
    full = [_as_server_returns(s) for s in desired_slices(NODE, UID, DRIVER, devices, 5)]
    plan = plan_slices(NODE, UID, DRIVER, devices, full[:1])
    assert plan.generation == 6 and {s["metadata"]["name"] for s in plan.apply} == {
        s["metadata"]["name"] for s in full
    }
    shrunk = plan_slices(NODE, UID, DRIVER, devices[:10], full)
    assert shrunk.delete == [full[1]["metadata"]["name"]]
    assert shrunk.apply[0]["spec"]["pool"]["resourceSliceCount"] == 1


def test_generation_never_goes_back() -> None:
    devices = [gpu(0)]
    observed = [_as_server_returns(s) for s in desired_slices(NODE, UID, DRIVER, devices, 2)]
    # We published generation 9 before; an older view must not win.
    plan = plan_slices(NODE, UID, DRIVER, devices, observed, last_generation=9)
    assert plan.generation == 10


def test_same_slice_sees_a_real_difference() -> None:
    (s,) = desired_slices(NODE, UID, DRIVER, [gpu(0)], 1)
    other = _as_server_returns(s)
    other["spec"]["devices"][0]["attributes"]["model"] = {"string": "H100"}
    assert not same_slice(s, other)


def test_quantities() -> None:
    assert format_bytes(80 * 2**30) == "80Gi"
    assert format_bytes(1536 * 2**20) == "1536Mi"
    assert format_bytes(1000) == "1000"
    assert parse_bytes("80Gi") == 80 * 2**30
    assert parse_bytes("1.5Gi") == 1536 * 2**20
    assert parse_bytes("2k") == 2000
