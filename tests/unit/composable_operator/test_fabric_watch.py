"""The operator's Fabric pass (composable_operator.fabric_status.FabricWatch) at cluster
size: hosts mapped to nodes from the Node cache, resources from kopf's index, one status
write a pass; and what it leaves for Online resources (composable_operator.inventories).
Kube is a fake that counts what it is asked."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import REGISTRY

from api.v1alpha1 import FabricSpec, NodeMapping
from composable_dra.fabric.backend import Device, Host, Inventory
from composable_dra.fabric.errors import FabricError
from composable_dra.fabric.registry import host_nodes
from composable_dra.k8s.kube import JSON
from composable_operator.cluster_cache import Nodes, slim_node
from composable_operator.fabric_status import FabricWatch, report, report_unreachable
from composable_operator.inventories import InventorySnapshot, online_look, still_online
from composable_operator.status_writes import StatusWrites, owned_status, with_changes

SPEC = FabricSpec.model_validate(
    {
        "backend": "redfish-composition",
        "endpoint": "https://fabric.example",
        "credentialsSecret": {"name": "s", "namespace": "ns"},
    }
)


class CountingKube:
    def __init__(self, nodes: list[JSON] | None = None) -> None:
        self.nodes = nodes or []
        self.gets: list[str] = []
        self.applies: list[JSON] = []
        self.patches: list[JSON] = []

    def get(self, url_path: str, **_: Any) -> JSON:
        self.gets.append(url_path)
        return {"items": self.nodes}

    def apply(self, _path: str, body: JSON, _manager: str) -> JSON:
        self.applies.append(body)
        return body

    def merge_patch(self, _path: str, body: JSON) -> JSON:
        self.patches.append(body)
        return body


def node(i: int, **extra: Any) -> JSON:
    return {
        "metadata": {"name": f"n{i}", "labels": {"big": "x" * 100}, **extra},
        "status": {
            "nodeInfo": {"systemUUID": f"UUID-{i}", "kernelVersion": "6"},
            "images": [{"names": ["img"], "sizeBytes": 1}] * 20,
        },
    }


def inventory(n: int) -> Inventory:
    hosts = {f"h{i}": Host(f"h{i}", f"uuid-{i}") for i in range(n)}
    return Inventory(hosts, {}, {})


def cached_nodes(kube: CountingKube, items: list[JSON]) -> Nodes:
    nodes = Nodes(kube)  # type: ignore[arg-type]
    nodes.informer.replace(items)  # as its list finds them
    return nodes


def test_the_pass_maps_hosts_to_nodes_from_the_node_cache_without_listing() -> None:
    items = [node(i) for i in range(300)]
    kube = CountingKube(items)
    watch = FabricWatch(kube, None, cached_nodes(kube, items))  # type: ignore[arg-type]
    mapped = watch.host_nodes(SPEC, inventory(300))
    assert mapped == {f"h{i}": f"n{i}" for i in range(300)}
    assert kube.gets == []
    # Without the cache it lists, as before (and maps the same).
    assert FabricWatch(kube, None).host_nodes(SPEC, inventory(300)) == mapped  # type: ignore[arg-type]
    assert kube.gets == ["/api/v1/nodes"]


def test_the_node_cache_keeps_what_mapping_reads_and_follows_deletions() -> None:
    kube = CountingKube()
    nodes = cached_nodes(kube, [node(1, annotations={"fabric/host": "h1"})])
    slim = nodes.get("n1")
    assert slim is not None and "images" not in slim["status"]
    assert slim == slim_node(node(1, annotations={"fabric/host": "h1"}))
    by_annotation = NodeMapping(by="annotation", annotation="fabric/host")
    assert host_nodes(nodes.all(), by_annotation, {"h1": Host("h1", "x")}) == {"h1": ["n1"]}
    nodes.informer.replace([node(1, deletionTimestamp="2026-01-01T00:00:00Z")])
    assert host_nodes(nodes.all(), NodeMapping(), inventory(2).hosts) == {}
    nodes.informer.replace([])
    assert nodes.get("n1") is None and nodes.all() == []


def test_claimed_devices_come_from_the_index_without_listing() -> None:
    kube = CountingKube()
    watch = FabricWatch(kube, None)  # type: ignore[arg-type]
    keys = [("fab", "gpu-1"), ("other", "gpu-2"), ("fab", "gpu-3")]
    assert watch.claimed("fab", keys) == {"gpu-1", "gpu-3"}
    assert kube.gets == []


def test_fabric_status_is_one_apply_a_pass_and_an_unreachable_pass_keeps_the_rest() -> None:
    kube = CountingKube()
    watch = FabricWatch(kube, None)  # type: ignore[arg-type]
    synced = {"reachable": True, "freeDevices": [{"model": "m", "zone": "z", "count": 2}]}
    watch.write_status("fab", synced, True, "Synced", "2 devices")
    watch.write_status("fab", {"reachable": False}, False, "FabricError", "down")
    assert kube.patches == [] and len(kube.applies) == 2
    last = kube.applies[-1]["status"]
    assert last["reachable"] is False and last["freeDevices"] == synced["freeDevices"]
    assert [c["status"] for c in last["conditions"]] == ["False"]


# -- Online resources between passes --------------------------------------------------


DEV = Device("gpu-1", "H100", "z1", "GPU-1", "attached", host="h1")
ONLINE = {"phase": "Online", "fabricHost": "h1", "deviceUUID": "gpu-1"}


def snap(device: Device | None, read_at: float) -> InventorySnapshot:
    devices = {device.id: device} if device else {}
    return InventorySnapshot(Inventory({}, devices, {}), read_at, 30)


@pytest.mark.parametrize(
    ("device", "status", "ok"),
    [
        (DEV, ONLINE, True),
        (None, ONLINE, False),  # the fabric forgot it
        (Device("gpu-1", "H100", "z1", "GPU-1", "free"), ONLINE, False),  # detached
        (Device("gpu-1", "H100", "z1", "GPU-1", "attached", host="h2"), ONLINE, False),
        (Device("gpu-1", "H100", "z1", "GPU-9", "attached", host="h1"), ONLINE, False),
        (DEV, {**ONLINE, "phase": "Attaching"}, False),
    ],
)
def test_still_online(device: Device | None, status: dict[str, str], ok: bool) -> None:
    assert (
        still_online(device, status.get("phase"), status.get("fabricHost"), status["deviceUUID"])
        is ok
    )


def test_online_look_trusts_newer_inventories_and_reads_when_none_comes() -> None:
    def look(s: InventorySnapshot | None, now: float, visible: bool = True) -> float | None:
        return online_look(s, "gpu-1", ONLINE, visible, 100, 70, now)

    # A pass newer than the last confirmation that shows it in place: confirmed then.
    assert look(snap(DEV, 105), 106) == 105
    # One that shows it moved: read.
    assert look(snap(None, 105), 106) is None
    # Only older passes (or none): fine until max_age, then read.
    assert look(snap(None, 90), 160) == 100
    assert look(None, 171) is None
    # The plugin stopped seeing it: read and decide at once.
    assert look(snap(DEV, 105), 106, visible=False) is None


def test_owned_status_changes_replace_conditions_by_type_and_drop_nones() -> None:
    plugin = {"type": "DeviceVisible", "status": "True"}
    status = {
        "phase": "Attaching",
        "pendingAttach": {"host": "h1"},
        "conditions": [plugin, {"type": "Attached", "status": "False"}],
    }
    owned = owned_status(status)
    assert plugin not in owned["conditions"]
    changed = with_changes(
        owned,
        {"pendingAttach": None, "deviceUUID": "U"},
        [{"type": "Attached", "status": "True"}, {"type": "Ready", "status": "False"}],
    )
    assert changed == {
        "phase": "Attaching",
        "deviceUUID": "U",
        "conditions": [
            {"type": "Attached", "status": "True"},
            {"type": "Ready", "status": "False"},
        ],
    }


def test_a_field_an_older_operators_merge_patch_still_holds_is_dropped_after_the_apply() -> None:
    # The apply drops only what this manager alone owned; the response shows the rest.
    class SharedKube(CountingKube):
        def apply(self, _path: str, body: JSON, _manager: str) -> JSON:
            self.applies.append(body)
            return {"status": {**body["status"], "pendingAttach": {"host": "h1"}}}

    kube = SharedKube()
    StatusWrites(kube).apply("r1", {"phase": "Online"})  # type: ignore[arg-type]
    assert len(kube.applies) == 1 and kube.patches == [{"status": {"pendingAttach": None}}]
    plain = CountingKube()
    StatusWrites(plain).apply("r1", {"phase": "Online"})  # type: ignore[arg-type]
    assert plain.patches == []


def test_the_reachable_gauge_follows_the_last_pass() -> None:
    kube = CountingKube()
    watch = FabricWatch(kube, None)  # type: ignore[arg-type]

    def reachable() -> float | None:
        return REGISTRY.get_sample_value("composable_dra_fabric_reachable", {"fabric": "gauged"})

    asyncio.run(report(watch, "gauged", inventory(1)))
    assert reachable() == 1
    asyncio.run(report_unreachable(watch, "gauged", FabricError("connection refused")))
    assert reachable() == 0
    assert kube.applies[-1]["status"]["reachable"] is False
    asyncio.run(report(watch, "gauged", inventory(1)))
    assert reachable() == 1


def test_a_model_with_no_free_device_left_reads_0_not_its_last_count() -> None:
    watch = FabricWatch(CountingKube(), None)  # type: ignore[arg-type]

    def free() -> float | None:
        labels = {"fabric": "drained", "model": "H100"}
        return REGISTRY.get_sample_value("composable_dra_pool_free_devices", labels)

    def inv(state: str) -> Inventory:
        gpu = Device("g1", "H100", "z1", "uuid-g", state, host=None)  # type: ignore[arg-type]
        return Inventory({}, {"g1": gpu}, {})

    asyncio.run(report(watch, "drained", inv("free")))
    assert free() == 1
    asyncio.run(report(watch, "drained", inv("attached")))
    assert free() == 0
