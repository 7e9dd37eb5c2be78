"""The kubelet plugin end to end: real control plane, real scheduler, real nodes (the
upstream kubelet, containerd, runc), and the plugin as its own process with the static
device source."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from dra_driver.cdi import spec_file_name
from testbed import ControlPlane
from testbed.plugin_process import PluginProcess, write_static_devices
from testbed.realnode import RealNode
from testbed.realnodes import gone, pod_with_claim, wait_output, wait_running
from testbed.wait import wait_for

RESOURCE = "resource.k8s.io/v1"
DRIVER = "gpu.composable.dra.io"


def gpu(node: str, i: int) -> dict[str, Any]:
    return {
        "uuid": f"GPU-{node}-{i}",
        "name": f"gpu-{i}",
        "productName": "NVIDIA A100-SXM4-80GB",
        "model": "A100",
        "pciBusID": f"0000:{0x3B + i:02x}:00.0",
        "memory": "80Gi",
    }


@dataclass
class Node:
    name: str
    uid: str
    real: RealNode

    @property
    def plugin(self) -> PluginProcess:
        assert self.real.plugin is not None
        return self.real.plugin

    def set_devices(self, count: int) -> None:
        write_static_devices(self.plugin.static_file, [gpu(self.name, i) for i in range(count)])


@pytest.fixture
def make_node(
    kube_json: Kube, control_plane: ControlPlane, node_bin_dir: Path, short_tmp: Path, unique: str
) -> Iterator[Callable[[str, int], Node]]:
    """Real nodes, each with the plugin running and registered with its kubelet."""
    nodes: list[Node] = []

    def make(suffix: str, devices: int) -> Node:
        name = f"{suffix}-{unique}"
        real = RealNode(name, node_bin_dir, control_plane, short_tmp / suffix)
        real.start()
        n = Node(name, kube_json.get(path("v1", "nodes", name))["metadata"]["uid"], real)
        nodes.append(n)
        n.set_devices(devices)
        real.start_plugin()
        return n

    yield make
    for n in nodes:
        # SIGTERM: a clean exit that takes both sockets with it.
        assert n.plugin.stop() == 0, n.plugin.log_tail()
        assert list(n.real.plugins_registry_dir.glob("*.sock")) == []
        assert list(n.real.plugins_dir.glob("*/dra.sock")) == []
        n.real.stop()


def node_slices(kube: Kube, node: str) -> list[JSON]:
    items: list[JSON] = kube.get(
        path(RESOURCE, "resourceslices"), fieldSelector=f"spec.nodeName={node}"
    )["items"]
    return items


def published(kube: Kube, node: str) -> set[str]:
    return {d["name"] for s in node_slices(kube, node) for d in s["spec"].get("devices", [])}


def wait_published(kube: Kube, n: Node, devices: set[str]) -> None:
    wait_for(
        lambda: published(kube, n.name) == devices,
        30,
        f"the slices of {n.name} to hold {sorted(devices)}",
        describe=n.plugin.log_tail,
    )


def pod(kube: Kube, namespace: str, name: str) -> JSON | None:
    return kube.get_or_none(path("v1", "pods", name, namespace=namespace))


def claim(kube: Kube, namespace: str, name: str) -> JSON:
    return kube.get(path(RESOURCE, "resourceclaims", name, namespace=namespace))


def cdi_env(n: Node, claim_uid: str) -> dict[str, str]:
    spec = json.loads((n.real.cdi_dir / spec_file_name(claim_uid)).read_text())
    (dev,) = spec["devices"]
    return dict(e.split("=", 1) for e in dev["containerEdits"]["env"])


def printed_env(n: Node, namespace: str, name: str) -> dict[str, str]:
    """The environment the pod's container printed: containerd injected the CDI edits."""
    out = wait_output(n.real, namespace, name, "COMPOSABLE_GPU_UUIDS=")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_two_nodes_publish_their_slices(
    kube_json: Kube, make_node: Callable[[str, int], Node]
) -> None:
    a, b = make_node("slice-a", 2), make_node("slice-b", 3)
    for n, count in ((a, 2), (b, 3)):
        wait_published(kube_json, n, {f"gpu-{i}" for i in range(count)})
        (s,) = node_slices(kube_json, n.name)
        assert s["spec"]["driver"] == DRIVER
        assert s["spec"]["pool"]["name"] == n.name
        assert s["spec"]["pool"]["resourceSliceCount"] == 1
        assert [(o["kind"], o["uid"]) for o in s["metadata"]["ownerReferences"]] == [
            ("Node", n.uid)
        ]
        dev = next(d for d in s["spec"]["devices"] if d["name"] == "gpu-1")
        assert dev["attributes"]["uuid"] == {"string": f"GPU-{n.name}-1"}
        assert dev["attributes"]["attachment"] == {"string": "local"}
        assert dev["attributes"]["model"] == {"string": "A100"}
        assert dev["capacity"]["memory"]["value"] == "80Gi"

    # Someone else deletes a slice: it comes back, at a newer pool generation.
    (old,) = node_slices(kube_json, a.name)
    kube_json.delete(path(RESOURCE, "resourceslices", old["metadata"]["name"]))

    def recreated() -> JSON | None:
        items = node_slices(kube_json, a.name)
        return items[0] if items and items[0]["metadata"]["uid"] != old["metadata"]["uid"] else None

    new = wait_for(recreated, 30, "the deleted slice to come back", describe=a.plugin.log_tail)
    assert new["spec"]["pool"]["generation"] > old["spec"]["pool"]["generation"]

    # Someone else labels our slice (a MODIFIED event, fields we do not set), then a
    # device is added: exactly one spec update follows, no update loop.
    kube_json.merge_patch(
        path(RESOURCE, "resourceslices", new["metadata"]["name"]),
        {"metadata": {"labels": {"example.com/seen": "yes"}}},
    )
    a.set_devices(3)
    wait_for(lambda: "gpu-2" in published(kube_json, a.name), 30, "the added device")
    (after,) = node_slices(kube_json, a.name)
    assert after["metadata"]["generation"] == new["metadata"]["generation"] + 1
    assert after["spec"]["pool"]["generation"] == new["spec"]["pool"]["generation"] + 1
    assert after["metadata"]["labels"]["example.com/seen"] == "yes"


def test_pods_prepared_survive_plugin_restart_and_unprepare(
    kube_json: Kube, make_node: Callable[[str, int], Node], device_class: str, namespace: str
) -> None:
    a, b = make_node("prep-a", 1), make_node("prep-b", 1)
    for n in (a, b):
        wait_published(kube_json, n, {"gpu-0"})

    pod_with_claim(kube_json, a.real, namespace, "one")
    pod_with_claim(kube_json, b.real, namespace, "two")
    for name, n in (("one", a), ("two", b)):
        p = wait_running(kube_json, n.real, namespace, name)
        assert p["spec"]["nodeName"] == n.name  # bound by the real scheduler
        c = claim(kube_json, namespace, name)
        (res,) = c["status"]["allocation"]["devices"]["results"]
        assert (res["driver"], res["pool"], res["device"]) == (DRIVER, n.name, "gpu-0")
        env = cdi_env(n, c["metadata"]["uid"])
        assert env["COMPOSABLE_GPU_UUIDS"] == f"GPU-{n.name}-0"
        assert env["COMPOSABLE_GPU_CLAIM_UID"] == c["metadata"]["uid"]
        # The container got what the spec says: containerd resolved the CDI devices.
        printed = printed_env(n, namespace, name)
        assert {k: printed[k] for k in env} == env

    # Kill node a's plugin between prepare and unprepare, and start it again.
    claim_one = claim(kube_json, namespace, "one")["metadata"]["uid"]
    spec_path = a.real.cdi_dir / spec_file_name(claim_one)
    spec_before = spec_path.read_bytes(), spec_path.stat().st_mtime_ns
    (slice_before,) = node_slices(kube_json, a.name)
    a.plugin.kill()
    a.plugin.start()
    wait_for(
        lambda: a.plugin.logged("slices in sync"),
        30,
        "the restarted plugin to sync",
        describe=a.plugin.log_tail,
    )
    a.real.wait_plugin_registered(1)
    (slice_after,) = node_slices(kube_json, a.name)
    assert slice_after["metadata"]["resourceVersion"] == slice_before["metadata"]["resourceVersion"]
    assert (spec_path.read_bytes(), spec_path.stat().st_mtime_ns) == spec_before

    # Deleting the pod unprepares through the restarted plugin: spec and checkpoint go.
    one = path("v1", "pods", "one", namespace=namespace)
    kube_json.delete(one)
    wait_for(gone(kube_json, one), 60, "pod one to go", describe=a.real.logs_tail)
    assert not spec_path.exists()
    checkpoint = json.loads((a.plugin.state_dir / "checkpoint.json").read_text())
    assert claim_one not in checkpoint["data"]["claims"]
    assert a.plugin.logged("claim unprepared")

    # The freed device is prepared again for a new pod on the same node.
    pod_with_claim(kube_json, a.real, namespace, "three")
    wait_running(kube_json, a.real, namespace, "three")


def test_added_device_makes_pending_pod_schedulable(
    kube_json: Kube, make_node: Callable[[str, int], Node], device_class: str, namespace: str
) -> None:
    n = make_node("grow", 0)
    wait_for(lambda: n.plugin.logged("slices in sync"), 30, "the empty pool")
    pod_with_claim(kube_json, n.real, namespace, "waits")

    def unschedulable() -> bool:
        p = pod(kube_json, namespace, "waits") or {}
        conds = p.get("status", {}).get("conditions", [])
        return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)

    wait_for(unschedulable, 30, "the pod to be found unschedulable")
    n.set_devices(1)
    p = wait_running(kube_json, n.real, namespace, "waits")
    assert p["spec"]["nodeName"] == n.name
