"""The node's ResourceSlices: desired state and the plan that reaches it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from composable_dra.k8s.quantity import format_bytes, parse_bytes
from dra_driver.device_source import DeviceInfo
from dra_driver.publish_once import publishable, reservations
from dra_driver.slices import (
    NETWORK_DOMAIN_LABEL,
    POOL_LABEL,
    LendPolicy,
    LendPolicyError,
    SlicePublisher,
    desired_slices,
    device_entry,
    plan_slices,
    pool_label_value,
    remote_device_name,
    same_slice,
    slice_name,
)
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, gpu

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


# -- lending ------------------------------------------------------------------------------

POLICY = LendPolicy(network_domain="rack-1", link_gbps=100, max_leases=3)


def _pool(devices: list[DeviceInfo], policy: LendPolicy | None = POLICY) -> list[dict[str, Any]]:
    return desired_slices(NODE, UID, DRIVER, devices, generation=2, lend=policy)


def _devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def _counter_sets(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c["counters"] for s in slices for c in s["spec"].get("sharedCounters") or []}


def test_lending_is_off_by_default() -> None:
    (s,) = desired_slices(NODE, UID, DRIVER, [gpu(0)], generation=1)
    assert "sharedCounters" not in s["spec"] and "perDeviceNodeSelection" not in s["spec"]
    assert set(_devices([s])) == {"gpu-0"}
    assert "consumesCounters" not in s["spec"]["devices"][0]


def test_counter_sets_one_per_gpu_and_one_for_the_link() -> None:
    slices = _pool([gpu(0), gpu(1)])
    assert _counter_sets(slices) == {
        "link": {"leases": {"value": "3"}},
        "gpu-0": {"gpu": {"value": "1"}},
        "gpu-1": {"gpu": {"value": "1"}},
    }
    # Counters and devices never share a slice; counters stay with the donor.
    for s in slices:
        assert not (s["spec"].get("sharedCounters") and s["spec"].get("devices"))
        if "sharedCounters" in s["spec"]:
            assert s["spec"]["nodeName"] == NODE
        else:
            assert s["spec"]["perDeviceNodeSelection"] is True and "nodeName" not in s["spec"]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert {s["metadata"]["labels"][POOL_LABEL] for s in slices} == {NODE}


def test_local_and_remote_share_the_gpu_counter_and_remote_takes_a_lease() -> None:
    devs = _devices(_pool([gpu(0)]))
    assert set(devs) == {"gpu-0", "gpu-0-remote"}
    local, remote = devs["gpu-0"], devs["gpu-0-remote"]
    assert local["nodeName"] == NODE and "nodeSelector" not in local
    assert local["consumesCounters"] == [
        {"counterSet": "gpu-0", "counters": {"gpu": {"value": "1"}}}
    ]
    assert remote["consumesCounters"] == [
        {"counterSet": "gpu-0", "counters": {"gpu": {"value": "1"}}},
        {"counterSet": "link", "counters": {"leases": {"value": "1"}}},
    ]
    assert "bindsToNode" not in local and "bindingConditions" not in local
    assert remote["bindsToNode"] is True
    assert remote["bindingConditions"] == ["RemoteGPUReady"]
    assert remote["bindingFailureConditions"] == ["RemoteGPUFailed"]


def test_remote_device_selects_other_nodes_of_the_domain() -> None:
    remote = _devices(_pool([gpu(0)]))["gpu-0-remote"]
    (term,) = remote["nodeSelector"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": NETWORK_DOMAIN_LABEL, "operator": "In", "values": ["rack-1"]}
    ]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": [NODE]}]
    policy = LendPolicy(
        network_domain="rack-1",
        link_gbps=100,
        max_leases=3,
        borrowers=LendPolicy.parse_borrowers("team=vision, example.com/tier=gpu-less"),
    )
    (term,) = _devices(_pool([gpu(0)], policy))["gpu-0-remote"]["nodeSelector"]["nodeSelectorTerms"]
    assert [(e["key"], e["values"]) for e in term["matchExpressions"]] == [
        ("team", ["vision"]),
        ("example.com/tier", ["gpu-less"]),
    ]
    assert term["matchFields"][0]["values"] == [NODE]


def test_remote_attributes_model_and_how_it_is_reached() -> None:
    policy = LendPolicy(
        network_domain="rack-1", link_gbps=200, max_leases=2, transports=("tcp", "ucx")
    )
    dev = gpu(0, pci_bus_id="0000:3b:00.0")
    devs = _devices(_pool([dev], policy))
    attrs = devs["gpu-0-remote"]["attributes"]
    assert attrs == {
        "uuid": {"string": dev.uuid},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "model": {"string": "A100"},
        "attachment": {"string": "remote"},
        "donorNode": {"string": NODE},
        "transports": {"string": "tcp,ucx"},
        "linkGbps": {"int": 200},
        "networkDomain": {"string": "rack-1"},
    }
    assert devs["gpu-0-remote"]["capacity"] == {"memory": {"value": "80Gi"}}
    # The local device is unchanged apart from where it is and what it consumes.
    assert devs["gpu-0"]["attributes"] == device_entry(dev)["attributes"]


def test_lending_layout_keeps_api_limits() -> None:
    slices = _pool([gpu(i) for i in range(40)])
    for s in slices:
        assert len(s["spec"].get("sharedCounters") or []) <= 8
        assert len(s["spec"].get("devices") or []) <= 64
    assert len(_counter_sets(slices)) == 41
    devs = _devices(slices)
    assert len(devs) == 80
    # A GPU's two devices are in one slice.
    for s in slices:
        names = {d["name"] for d in s["spec"].get("devices") or []}
        assert all(n + "-remote" in names for n in names if not n.endswith("-remote"))


def test_lending_with_no_devices_publishes_only_the_link() -> None:
    slices = _pool([])
    assert _counter_sets(slices) == {"link": {"leases": {"value": "3"}}}
    assert _devices(slices) == {}


def test_names_that_would_collide() -> None:
    # A device named like the link set pushes the link set aside.
    link_named = DeviceInfo(name="link", uuid="GPU-link")
    assert set(_counter_sets(_pool([link_named, gpu(0)]))) == {"link", "link-1", "gpu-0"}
    # A GPU whose remote name is taken is published, not lent.
    squatter = DeviceInfo(name="gpu-0-remote", uuid="GPU-squat")
    devs = _devices(_pool([gpu(0), squatter]))
    assert devs["gpu-0-remote"]["attributes"]["uuid"] == {"string": "GPU-squat"}
    assert "gpu-0-remote-remote" in devs and len(devs) == 3
    # Long names stay DNS labels and distinct.
    long_a, long_b = "g" * 60 + "a", "g" * 60 + "b"
    assert remote_device_name(long_a) != remote_device_name(long_b)
    assert all(len(remote_device_name(n)) <= 63 for n in (long_a, long_b, "gpu-0"))


def test_gpu_serving_a_pool_allocation_is_not_lent() -> None:
    # The publisher gets what visibility allows: a GPU serving a pool allocation is
    # neither published locally nor lent.
    res = reservations(
        [
            {
                "spec": {"claimRef": {"name": "c", "namespace": "ns"}},
                "status": {"phase": "Online", "deviceUUID": gpu(0).uuid},
            }
        ]
    )
    visible = publishable([gpu(0), gpu(1)], res, published=set())
    devs = _devices(_pool(visible))
    assert set(devs) == {"gpu-1", "gpu-1-remote"}
    assert "gpu-0" not in _counter_sets(_pool(visible))


def test_lending_plan_is_stable_against_server_echo() -> None:
    devices = [gpu(i) for i in range(3)]
    desired = desired_slices(NODE, UID, DRIVER, devices, 5, lend=POLICY)
    observed = []
    for s in desired:
        o = copy.deepcopy(s)
        o["metadata"].update(resourceVersion="1", uid="x")
        for c in o["spec"].get("sharedCounters") or []:
            c["counters"] = {k: {"value": v["value"]} for k, v in c["counters"].items()}
        for d in o["spec"].get("devices") or []:
            d["capacity"]["memory"]["value"] = str(parse_bytes(d["capacity"]["memory"]["value"]))
        observed.append(o)
    assert plan_slices(NODE, UID, DRIVER, devices, observed, 5, lend=POLICY).empty
    # Turning lending off rewrites the pool as one plain slice and drops the rest.
    off = plan_slices(NODE, UID, DRIVER, devices, observed, 5)
    assert off.generation == 6 and len(off.apply) == 1
    assert len(off.delete) == len(desired) - 1
    # A new knee is a change.
    knee = LendPolicy(network_domain="rack-1", link_gbps=100, max_leases=4)
    assert not plan_slices(NODE, UID, DRIVER, devices, observed, 5, lend=knee).empty


@pytest.mark.parametrize(
    "kw",
    [
        {"network_domain": ""},
        {"network_domain": "has space"},
        {"network_domain": "x" * 64},
        {"link_gbps": 0},
        {"max_leases": 0},
        {"transports": ("shm",)},
        {"transports": ()},
        {"borrowers": (("bad key!", "v"),)},
        {"borrowers": (("k", "bad value!"),)},
    ],
)
def test_bad_policy_is_a_typed_error(kw: dict[str, Any]) -> None:
    args: dict[str, Any] = {"network_domain": "rack-1", "link_gbps": 100, "max_leases": 2, **kw}
    with pytest.raises(LendPolicyError):
        LendPolicy(**args)


def test_borrower_selector_parse_errors() -> None:
    with pytest.raises(LendPolicyError):
        LendPolicy.parse_borrowers("team")
    with pytest.raises(LendPolicyError):
        LendPolicy.parse_borrowers("=x")
    assert LendPolicy.parse_borrowers("") == ()


def test_pool_label_value_for_long_node_names() -> None:
    assert pool_label_value("node-a") == "node-a"
    long = "n" * 70 + ".example.com"
    value = pool_label_value(long)
    assert len(value) <= 63 and value != pool_label_value(long + "x")


def test_slices_of_an_older_plugin_without_the_pool_label_are_rewritten() -> None:
    # The publisher watches its slices by the pool label: one written before the label
    # existed is rewritten with it (and found meanwhile by spec.nodeName).
    devices = [gpu(0)]
    observed = [_as_server_returns(s) for s in desired_slices(NODE, UID, DRIVER, devices, 3)]
    del observed[0]["metadata"]["labels"][POOL_LABEL]
    plan = plan_slices(NODE, UID, DRIVER, devices, observed)
    assert plan.generation == 4
    assert plan.apply[0]["metadata"]["labels"][POOL_LABEL] == NODE


class PatchRecorder:
    def __init__(self) -> None:
        self.patches: list[str] = []

    def merge_patch(self, url_path: str, body: Any) -> Any:
        self.patches.append(url_path)
        return {}


def test_only_a_lending_plugin_watches_claims_and_it_touches_its_first_slice_once() -> None:
    assert SlicePublisher(PatchRecorder(), NODE, "uid", DRIVER)._claims is None  # type: ignore[arg-type]
    kube = PatchRecorder()
    pub = SlicePublisher(kube, NODE, "uid", DRIVER, lend=POLICY)  # type: ignore[arg-type]
    assert pub._claims is not None
    remote = {"driver": DRIVER, "pool": NODE, "device": "gpu-0-remote"}
    claim = {
        "metadata": {"uid": "u1"},
        "status": {
            "allocation": {
                "devices": {"results": [{**remote, "bindingConditions": ["RemoteGPUReady"]}]}
            }
        },
    }
    pub._claim_event("ADDED", claim)
    assert pub._waker.event("DELETED", claim, mono=0.0)  # due long ago
    pub._reconcile_once()  # no devices reported yet: no slices, but the touch goes
    pub._reconcile_once()
    assert kube.patches == [
        f"/apis/resource.k8s.io/v1/resourceslices/{slice_name(NODE, DRIVER, 0)}"
    ]


def test_without_device_taints_health_is_not_published_as_taints() -> None:
    from composable_dra.model.health import Health, HealthReport, Reason

    # v1.35 keeps no device taints: a taint written would be dropped, the slices never
    # read back as written, and the publisher would write them again on every pass.
    bad = {"gpu-0": HealthReport("gpu-0", Health.UNHEALTHY, Reason.FABRIC_CRITICAL, source="x")}
    served = SlicePublisher(PatchRecorder(), NODE, "uid", DRIVER)  # type: ignore[arg-type]
    served.set_health(bad)
    assert served._health == bad
    old = SlicePublisher(PatchRecorder(), NODE, "uid", DRIVER, taints=False)  # type: ignore[arg-type]
    old.set_health(bad)
    assert old._health == {} and not old._wake.is_set()
