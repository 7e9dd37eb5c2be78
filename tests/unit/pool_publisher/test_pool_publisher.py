"""The pool publisher's decisions: which devices, which nodes, which slices, when to write."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.v1alpha1 import NodeMapping
from composable_dra.fabric.backend import Device, Host, Inventory, Zone
from composable_dra.fabric.registry import node_mapping_fields
from composable_dra.k8s.kept import claim_fields
from composable_dra.model import names
from pool_publisher import publish
from pool_publisher.publish import (
    FabricView,
    attachment_states,
    desired_pools,
    device_name,
    held_blocks,
    host_nodes,
    live_allocations,
    plan_pools,
    pool_slices,
    published_devices,
    read_again,
    same_slice,
)

DRIVER = names.DRIVER


def inventory(states: dict[str, str] | None = None) -> Inventory:
    states = states or {}
    hosts = {h: Host(h, f"uuid-{h}") for h in ("host-1", "host-2", "host-3")}
    devices = {}
    for i in range(1, 9):
        bid = f"gpu-{i}"
        zone = "zone-1" if i <= 5 else "zone-2"
        st = states.get(bid, "free")
        devices[bid] = Device(
            bid,
            "H100",
            zone,
            f"u-{i}",
            st,  # type: ignore[arg-type]
            host="host-1" if st != "free" else None,
            memory_mib=81920,
            manufacturer="NVIDIA",
        )
    zones = {
        "zone-1": Zone(
            "zone-1", frozenset({"host-1", "host-2"}), frozenset(f"gpu-{i}" for i in range(1, 6))
        ),
        "zone-2": Zone(
            "zone-2", frozenset({"host-2", "host-3"}), frozenset(f"gpu-{i}" for i in range(6, 9))
        ),
    }
    return Inventory(hosts, devices, zones)


def node(name: str, system_uuid: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"nodeInfo": {"systemUUID": system_uuid}}}


def view(inv: Inventory, held: frozenset[str] = frozenset()) -> FabricView:
    nodes = [
        node("node-a", "uuid-host-1"),
        node("node-b", "uuid-host-2"),
        node("node-c", "uuid-host-3"),
    ]
    return FabricView("fab", "fab-uid", inv, host_nodes(nodes, NodeMapping(), inv), held)


def test_device_names_are_dns_labels_derived_deterministically():
    assert device_name("gpu-1") == "gpu-1"
    odd = device_name("Block_7/GPU")
    assert odd == device_name("Block_7/GPU")
    assert odd.startswith("block-7-gpu-") and len(odd) <= 63
    assert device_name("Block_7/GPU") != device_name("block-7-gpu")


def test_one_pool_per_zone_with_exactly_the_nodes_the_zone_reaches():
    pools = desired_pools(view(inventory()), set())
    assert set(pools) == {"fab/zone-1", "fab/zone-2"}
    assert pools["fab/zone-1"].nodes == ("node-a", "node-b")
    assert pools["fab/zone-2"].nodes == ("node-b", "node-c")
    assert [d.id for d in pools["fab/zone-1"].devices] == [f"gpu-{i}" for i in range(1, 6)]


def test_attached_and_held_devices_are_left_out_unless_a_live_allocation_names_them():
    inv = inventory({"gpu-1": "attached", "gpu-2": "busy"})
    pools = desired_pools(view(inv, held=frozenset({"gpu-3"})), set())
    assert [d.id for d in pools["fab/zone-1"].devices] == ["gpu-4", "gpu-5"]
    live = {("fab/zone-1", "gpu-1"), ("fab/zone-1", "gpu-3")}
    pools = desired_pools(view(inv, held=frozenset({"gpu-3"})), live)
    assert [d.id for d in pools["fab/zone-1"].devices] == ["gpu-1", "gpu-3", "gpu-4", "gpu-5"]


def ids(pools: dict[str, Any], pool: str) -> list[str]:
    return [d.id for d in pools[pool].devices]


def test_a_pool_offers_at_most_max_free_free_devices_and_every_allocated_one():
    # The scheduler's cost per pod grows with the free devices every node sees.
    inv = inventory({"gpu-2": "attached"})
    assert ids(desired_pools(view(inv), set(), max_free=2), "fab/zone-1") == ["gpu-1", "gpu-3"]
    live = {("fab/zone-1", "gpu-1"), ("fab/zone-1", "gpu-2")}
    pools = desired_pools(view(inv, held=frozenset({"gpu-1"})), live, max_free=2)
    # Allocated ones stay (and do not count): the next free ones fill the window.
    assert ids(pools, "fab/zone-1") == ["gpu-1", "gpu-2", "gpu-3", "gpu-4"]
    assert pools["fab/zone-1"].allocated == frozenset({"gpu-1", "gpu-2"})
    assert ids(desired_pools(view(inv), set(), max_free=0), "fab/zone-1") == [
        "gpu-1",
        "gpu-3",
        "gpu-4",
        "gpu-5",
    ]


def test_devices_already_published_keep_their_place_in_the_window():
    # gpu-5 was offered (the scheduler may have just picked it); gpu-1 came free since.
    inv = inventory()
    published = frozenset({("fab/zone-1", "gpu-4"), ("fab/zone-1", "gpu-5")})
    pools = desired_pools(view(inv), set(), max_free=2, published=published)
    assert ids(pools, "fab/zone-1") == ["gpu-4", "gpu-5"]
    pools = desired_pools(view(inv), set(), max_free=3, published=published)
    assert ids(pools, "fab/zone-1") == ["gpu-1", "gpu-4", "gpu-5"]


def test_published_devices_reads_every_slice_of_every_pool():
    pools = desired_pools(view(inventory()), set())
    slices = [s for p in pools.values() for s in pool_slices(p, 1, DRIVER, max_per_slice=2)]
    assert published_devices(slices) == {
        (pool, d.id) for pool, spec in pools.items() for d in spec.devices
    }


@settings(max_examples=60)
@given(
    states=st.lists(st.sampled_from(["free", "attached", "busy"]), min_size=8, max_size=8),
    held=st.sets(st.integers(1, 8)),
    live=st.sets(st.integers(1, 8)),
    published=st.sets(st.integers(1, 8)),
    max_free=st.integers(0, 6),
)
def test_the_window_never_drops_an_allocated_device_nor_offers_an_unfree_one(
    states: list[str], held: set[int], live: set[int], published: set[int], max_free: int
) -> None:
    inv = inventory({f"gpu-{i + 1}": s for i, s in enumerate(states)})
    zone_of = {d.id: f"fab/{d.zone}" for d in inv.devices.values()}
    live_refs = {(zone_of[f"gpu-{i}"], f"gpu-{i}") for i in live}
    shown = frozenset((zone_of[f"gpu-{i}"], f"gpu-{i}") for i in published)
    v = view(inv, held=frozenset(f"gpu-{i}" for i in held))
    every = desired_pools(v, live_refs)
    windowed = desired_pools(v, live_refs, max_free, shown)
    for pool, spec in windowed.items():
        got = {d.id for d in spec.devices}
        assert got <= {d.id for d in every[pool].devices}
        assert {dev for p, dev in live_refs if p == pool} <= got
        free = got - spec.allocated
        wanted = len({d.id for d in every[pool].devices} - every[pool].allocated)
        assert len(free) == (wanted if max_free == 0 else min(max_free, wanted))
        kept = {dev for p, dev in shown if p == pool} & ({d.id for d in every[pool].devices})
        if max_free and len(kept - spec.allocated) <= max_free:
            assert kept - spec.allocated <= free


def test_a_zone_without_nodes_has_no_pool():
    inv = inventory()
    v = FabricView("fab", "uid", inv, {"host-1": ["node-a"]})
    assert set(desired_pools(v, set())) == {"fab/zone-1"}


def test_slice_shape():
    pools = desired_pools(view(inventory()), set())
    [s] = pool_slices(pools["fab/zone-2"], 3, DRIVER)
    spec = s["spec"]
    assert spec["pool"] == {"name": "fab/zone-2", "generation": 3, "resourceSliceCount": 1}
    assert spec["nodeSelector"]["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b", "node-c"]}
            ]
        }
    ]
    assert "nodeName" not in spec
    dev = spec["devices"][0]
    assert dev["name"] == "gpu-6"
    assert dev["bindsToNode"] is True
    assert dev["bindingConditions"] == [names.FABRIC_DEVICE_READY]
    assert dev["bindingFailureConditions"] == [
        names.FABRIC_DEVICE_FAILED,
        names.FABRIC_DEVICE_RESCHEDULE,
    ]
    attrs = {k: v["string"] for k, v in dev["attributes"].items()}
    assert attrs == {
        "model": "H100",
        "uuid": "u-6",
        "productName": "NVIDIA H100",
        "attachment": "pool",
        "fabric": "fab",
        "zone": "zone-2",
        "blockID": "gpu-6",
    }
    assert dev["capacity"] == {"memory": {"value": "80Gi"}}
    assert s["metadata"]["ownerReferences"][0]["kind"] == "Fabric"


def test_at_most_max_devices_a_slice_and_the_count_right():
    pools = desired_pools(view(inventory()), set())
    slices = pool_slices(pools["fab/zone-1"], 1, DRIVER, max_per_slice=2)
    assert [len(s["spec"]["devices"]) for s in slices] == [2, 2, 1]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert len({s["metadata"]["name"] for s in slices}) == 3


def served(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the API server gives back: extra fields, quantities in another spelling."""
    out = []
    for o in copy.deepcopy(objs):
        o["metadata"]["resourceVersion"] = "7"
        o["metadata"]["uid"] = "x"
        for d in o["spec"]["devices"]:
            if "capacity" in d:
                d["capacity"]["memory"]["value"] = str(80 * 2**30)
        out.append(o)
    return out


def test_no_update_loop_and_a_change_rewrites_the_pool_at_a_higher_generation():
    pools = desired_pools(view(inventory()), set())
    first = plan_pools(pools, [], DRIVER)
    assert {s["spec"]["pool"]["generation"] for s in first.apply} == {1}
    observed = served(first.apply)
    again = plan_pools(pools, observed, DRIVER, first.generations)
    assert again.empty
    # gpu-2 got attached elsewhere: zone-1 changes, zone-2 does not.
    changed = desired_pools(view(inventory({"gpu-2": "attached"})), set())
    plan = plan_pools(changed, observed, DRIVER, again.generations)
    assert {s["spec"]["pool"]["name"] for s in plan.apply} == {"fab/zone-1"}
    assert plan.generations["fab/zone-1"] == 2
    assert plan.generations["fab/zone-2"] == 1
    assert not plan.delete


def test_slices_of_pools_no_longer_wanted_are_deleted():
    pools = desired_pools(view(inventory()), set())
    observed = served(plan_pools(pools, [], DRIVER, max_per_slice=2).apply)
    only_two = {"fab/zone-2": pools["fab/zone-2"]}
    plan = plan_pools(only_two, observed, DRIVER, max_per_slice=2)
    assert sorted(plan.delete) == sorted(
        o["metadata"]["name"] for o in observed if o["spec"]["pool"]["name"] == "fab/zone-1"
    )
    # A pool that shrank below one slice: the extra slice goes.
    fewer = desired_pools(view(inventory({"gpu-1": "attached", "gpu-2": "attached"})), set())
    plan = plan_pools(fewer, observed, DRIVER, max_per_slice=2)
    assert len(plan.delete) == 1


def test_same_slice_ignores_server_fields_only():
    pools = desired_pools(view(inventory()), set())
    [s] = pool_slices(pools["fab/zone-2"], 1, DRIVER)
    [o] = served([s])
    assert same_slice(s, o)
    o["spec"]["devices"][0]["bindsToNode"] = False
    assert not same_slice(s, o)


def test_live_allocations_and_held_blocks():
    claims: list[dict[str, Any]] = [
        {
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"driver": DRIVER, "pool": "fab/zone-1", "device": "gpu-1"},
                            {"driver": "other", "pool": "p", "device": "d"},
                        ]
                    }
                }
            }
        },
        {"status": {}},
    ]
    assert live_allocations(claims, DRIVER) == {("fab/zone-1", "gpu-1")}
    crs = [
        {"spec": {"fabric": "fab", "deviceID": "gpu-3"}, "status": {"phase": "Attaching"}},
        {"spec": {"fabric": "fab", "deviceID": "gpu-4"}, "status": {"phase": "Detached"}},
        {"spec": {"fabric": "other", "deviceID": "gpu-5"}},
    ]
    assert held_blocks(crs, "fab") == frozenset({"gpu-3"})


def test_an_allocated_device_is_tainted_no_schedule_and_slices_hold_64_then():
    live = {("fab/zone-1", "gpu-1")}
    pools = desired_pools(view(inventory({"gpu-1": "attached"})), live)
    slices = pool_slices(pools["fab/zone-1"], 1, DRIVER, max_per_slice=128)
    devs = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    assert devs["gpu-1"]["taints"] == [
        {"key": "composable.dra.io/allocated", "value": "true", "effect": "NoSchedule"}
    ]
    assert "taints" not in devs["gpu-2"]
    free = desired_pools(view(inventory()), set())
    assert not same_slice(pool_slices(free["fab/zone-1"], 1, DRIVER)[0], slices[0])


def test_the_fabric_is_read_again_when_an_attachment_moves_on_not_on_every_write() -> None:
    def cr(phase: str, deleting: bool = False, **status: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": "r1"}
        if deleting:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "status": {"phase": phase, **status}}

    attaching = attachment_states([cr("Attaching")])
    assert attachment_states([cr("Attaching", error="busy", deviceUUID="u")]) == attaching
    assert attachment_states([cr("Online", deviceUUID="u")]) != attaching
    assert attachment_states([cr("Online", deleting=True)]) != attachment_states([cr("Online")])
    assert attachment_states([]) != attaching


def test_the_fabric_is_read_again_when_a_hold_ends_not_as_an_attach_moves_on() -> None:
    # At 1,000 attaches each re-read of a 4,000-block fabric on Attaching -> Online made
    # the publisher's cost quadratic; only a hold that ends can free a block.
    def states(*entries: tuple[str, str]) -> frozenset[tuple[str, str, bool]]:
        return frozenset((name, phase, False) for name, phase in entries)

    live = {("fab/zone-1", "gpu-1")}
    attaching = states(("r1", "Attaching"))
    online = states(("r1", "Online"))
    assert read_again(attaching, online, live, live) is False
    assert read_again(states(), attaching, set(), live) is False  # a new attach
    assert read_again(online, states(("r1", "Online"), ("r2", "Attaching")), live, live) is False
    assert read_again(online, states(("r1", "Detached")), live, live) is True
    assert read_again(online, states(), live, live) is True  # the resource is gone


def test_the_fabric_is_read_again_when_an_allocation_ends() -> None:
    # An inventory read before the attach still says "free": when the allocation that kept
    # the block in the pool ends, only a fresh read keeps the attached GPU out of it.
    states = frozenset({("r1", "Online", False)})
    a, b = ("fab/zone-1", "gpu-1"), ("fab/zone-1", "gpu-2")
    assert read_again(states, states, {a}, {a, b}) is False  # a new allocation: no
    assert read_again(states, states, {a, b}, {b}) is True  # one ended
    assert read_again(None, states, set(), set()) is True  # the first pass


class _CountingHosts(dict[str, Host]):
    """A host map that counts the passes over its hosts."""

    passes = 0

    def values(self) -> Any:
        self.passes += 1
        return super().values()


def test_host_nodes_maps_every_node_in_one_pass_over_the_hosts() -> None:
    # A scan of every host per node was quadratic: 1,000 nodes x 1,000 hosts a pass.
    hosts = _CountingHosts({f"h{i}": Host(f"h{i}", f"UUID-{i}") for i in range(200)})
    inv = Inventory(hosts, {}, {})
    nodes = [node(f"n{i}", f"uuid-{i}") for i in range(200)]  # UUIDs compare normalized
    nodes.append(node("elsewhere", "uuid-not-on-this-fabric"))
    mapped = host_nodes(nodes, NodeMapping(), inv)
    assert mapped == {f"h{i}": [f"n{i}"] for i in range(200)}
    assert hosts.passes <= 1


def test_a_pool_found_in_place_is_not_compared_again_until_it_or_its_slices_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Comparing every pool's 4,000 devices on every pass was the publisher's steady cost.
    compared: list[str] = []
    real = publish.same_slice

    def spy(desired: dict[str, Any], observed: dict[str, Any]) -> bool:
        compared.append(desired["spec"]["pool"]["name"])
        return real(desired, observed)

    monkeypatch.setattr(publish, "same_slice", spy)
    pools = desired_pools(view(inventory()), set())
    observed = served(plan_pools(pools, [], DRIVER).apply)
    found = plan_pools(pools, observed, DRIVER, {p: 1 for p in pools})
    assert found.empty and set(found.in_place) == set(pools) and compared
    compared.clear()
    again = plan_pools(pools, observed, DRIVER, found.generations, in_place=found.in_place)
    assert again.empty and again.generations == found.generations and compared == []
    # Someone else rewrote a zone-2 slice: that pool is compared (and put back) again.
    touched = copy.deepcopy(observed)
    zone2 = next(o for o in touched if o["spec"]["pool"]["name"] == "fab/zone-2")
    zone2["metadata"]["resourceVersion"] = "8"
    zone2["spec"]["devices"] = []
    plan = plan_pools(pools, touched, DRIVER, again.generations, in_place=again.in_place)
    assert compared == ["fab/zone-2"]
    assert {s["spec"]["pool"]["name"] for s in plan.apply} == {"fab/zone-2"}
    assert "fab/zone-2" not in plan.in_place and "fab/zone-1" in plan.in_place
    # A changed spec is planned whatever was in place.
    changed = desired_pools(view(inventory({"gpu-2": "attached"})), set())
    plan = plan_pools(changed, observed, DRIVER, again.generations, in_place=again.in_place)
    assert {s["spec"]["pool"]["name"] for s in plan.apply} == {"fab/zone-1"}


def test_the_kept_fields_of_nodes_and_claims_decide_as_the_whole_objects() -> None:
    inv = Inventory({f"h{i}": Host(f"h{i}", f"UUID-{i}") for i in range(3)}, {}, {})
    nodes = [
        {
            "metadata": {
                "name": f"n{i}",
                "resourceVersion": "4",
                "annotations": {"fabric/host": f"h{i}", "big": "x" * 100},
                **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if i == 2 else {}),
            },
            "spec": {"providerID": f"cloud://region/h{i}", "podCIDR": "10.0.0.0/24"},
            "status": {
                "nodeInfo": {"systemUUID": f"uuid-{i}", "bootID": "b"},
                "images": [{"names": ["img"], "sizeBytes": 1}],
            },
        }
        for i in range(3)
    ]
    nodes.append({"metadata": {"name": "bare"}})
    kept = [node_mapping_fields(n) for n in nodes]
    assert "images" not in str(kept) and "podCIDR" not in str(kept)
    for mapping in (
        NodeMapping(),
        NodeMapping(by="providerID"),
        NodeMapping(by="annotation", annotation="fabric/host"),
    ):
        assert host_nodes(kept, mapping, inv) == host_nodes(nodes, mapping, inv)
        assert host_nodes(kept, mapping, inv) == {"h0": ["n0"], "h1": ["n1"]}
    claims: list[dict[str, Any]] = [
        {
            "metadata": {"name": "c", "namespace": "ns", "uid": "u", "resourceVersion": "9"},
            "spec": {"devices": {"requests": [{"name": "gpu"}]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"driver": DRIVER, "pool": "fab/zone-1", "device": "gpu-1", "x": 1},
                            {"driver": "other", "pool": "p", "device": "d"},
                        ]
                    },
                    "nodeSelector": {"nodeSelectorTerms": []},
                },
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pu"}],
            },
        },
        {"metadata": {"name": "d", "namespace": "ns"}, "status": {}},
    ]
    kept_claims = [claim_fields(c) for c in claims]
    assert live_allocations(kept_claims, DRIVER) == live_allocations(claims, DRIVER)
    assert kept_claims[0]["metadata"] == claims[0]["metadata"]
    assert "reservedFor" not in str(kept_claims) and "nodeSelector" not in str(kept_claims)


def test_only_a_fabrics_spec_or_deletion_makes_the_publisher_read_the_fabrics_again() -> None:
    pub = publish.PoolPublisher(None, None)  # type: ignore[arg-type]  # not started

    def fabric(rv: int, generation: int, **meta: Any) -> dict[str, Any]:
        return {
            "metadata": {"name": "fab", "uid": "u", "resourceVersion": str(rv), **meta}
            | {"generation": generation},
            "spec": {"pollIntervalSeconds": 30},
            "status": {"rv": rv},
        }

    def read_again_after(items: list[dict[str, Any]]) -> bool:
        pub._all_dirty = False
        pub._wake.clear()
        pub.fabric_informer.replace(items)
        assert pub._wake.is_set() == pub._all_dirty
        return pub._all_dirty

    assert read_again_after([fabric(1, 1)])  # a new Fabric
    # The operator's status write on each poll: a new resourceVersion, the same spec.
    assert not read_again_after([fabric(2, 1)])
    assert not read_again_after([fabric(3, 1)])
    assert read_again_after([fabric(4, 2)])  # a spec change
    assert read_again_after([fabric(5, 2, deletionTimestamp="2026-11-23T00:00:00Z")])
    assert read_again_after([])  # gone


class PatchRecorder:
    """Records merge patches: all that a wake-up touch sends."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []

    def merge_patch(self, url_path: str, body: Any) -> Any:
        self.patches.append((url_path, body))
        return {}


def pending_then_deleted(pub: publish.PoolPublisher) -> None:
    result: dict[str, Any] = {"driver": DRIVER, "pool": "fab/zone-1", "device": "gpu-1"}
    result["bindingConditions"] = ["FabricDeviceReady"]
    allocation = {"devices": {"results": [result]}}
    claim = {"metadata": {"uid": "u1"}, "status": {"allocation": allocation}}
    pub._waker.event("ADDED", claim, mono=0.0)
    pub._waker.event("DELETED", claim, mono=0.0)  # due at 7, long past


def test_a_dropped_pending_allocation_touches_its_pools_first_slice_once() -> None:
    kube = PatchRecorder()
    pub = publish.PoolPublisher(kube, None)  # type: ignore[arg-type]  # not started
    slices = [
        {"metadata": {"name": n, "resourceVersion": "1"}, "spec": {"pool": {"name": p}}}
        for n, p in (("fab-zone-1-1", "fab/zone-1"), ("fab-zone-1-0", "fab/zone-1"), ("z", "x/y"))
    ]
    pub.slice_informer.replace(slices)
    pending_then_deleted(pub)
    pub._wake_pods(publish.PoolPlan())
    ((url, body),) = kube.patches
    assert url.endswith("/resourceslices/fab-zone-1-0")
    assert list(body["metadata"]["annotations"]) == ["composable.dra.io/woken-at"]
    pub._wake_pods(publish.PoolPlan())
    assert len(kube.patches) == 1  # once


def test_a_rewrite_of_the_pool_after_its_time_is_the_wake_up() -> None:
    kube = PatchRecorder()
    pub = publish.PoolPublisher(kube, None)  # type: ignore[arg-type]  # not started
    pending_then_deleted(pub)
    applied = publish.PoolPlan(apply=[{"spec": {"pool": {"name": "fab/zone-1"}}}])
    pub._wake_pods(applied)
    assert kube.patches == []
    assert pub._waker.next_in() is None
