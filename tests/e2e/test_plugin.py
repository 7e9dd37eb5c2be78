"""The kubelet plugin end to end: real control plane, real scheduler, kubelet emulator,
and the plugin as its own process with the static device source."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from composable_dra.kube import JSON, Conflict, Kube, path
from dra_driver.cdi import resolve, spec_file_name
from hack.localcluster import ControlPlane
from hack.localcluster.kubelet_emulator import KubeletEmulator
from hack.localcluster.nodes import create_node, delete_node
from hack.localcluster.plugin_process import PluginProcess, write_static_devices
from hack.localcluster.wait import wait_for

RESOURCE = "resource.k8s.io/v1"
DRIVER = "gpu.composable.dra.io"
CLASS = "composable-gpu"


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
    kubelet: KubeletEmulator
    plugin: PluginProcess

    def set_devices(self, count: int) -> None:
        write_static_devices(self.plugin.static_file, [gpu(self.name, i) for i in range(count)])


@pytest.fixture(scope="module")
def device_class(kube_json: Kube) -> str:
    with contextlib.suppress(Conflict):
        kube_json.create(
            path(RESOURCE, "deviceclasses"),
            {
                "metadata": {"name": CLASS},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
    return CLASS


@pytest.fixture
def make_node(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> Iterator[Callable[[str, int], Node]]:
    nodes: list[Node] = []

    def make(suffix: str, devices: int) -> Node:
        name = f"{suffix}-{unique}"
        node = create_node(kube_json.api, name)
        root = short_tmp / suffix
        kubelet = KubeletEmulator(kube_json, name, root / "kubelet", root / "cdi")
        kubelet.start()
        plugin = PluginProcess(
            node=name,
            kubeconfig=control_plane.kubeconfig,
            plugins_registry_dir=kubelet.plugins_registry_dir,
            plugins_dir=kubelet.plugins_dir,
            cdi_dir=kubelet.cdi_dir,
            workdir=root / "plugin",
        )
        n = Node(name, node["metadata"]["uid"], kubelet, plugin)
        n.set_devices(devices)
        plugin.start()
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        # SIGTERM: a clean exit that takes both sockets with it.
        assert n.plugin.stop() == 0, n.plugin.log_tail()
        assert list(n.kubelet.plugins_registry_dir.glob("*.sock")) == []
        assert list(n.kubelet.plugins_dir.glob("*/dra.sock")) == []
        n.kubelet.stop()
        delete_node(kube_json.api, n.name)


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


def wait_registered(n: Node) -> None:
    wait_for(
        lambda: n.kubelet.registered_drivers().get(DRIVER) == "v1",
        30,
        f"the plugin of {n.name} to register over v1",
        describe=n.plugin.log_tail,
    )


def create_claim_pod(kube: Kube, namespace: str, name: str, node: str | None = None) -> None:
    kube.create(
        path(RESOURCE, "resourceclaims", namespace=namespace),
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}
            },
        },
    )
    spec: JSON = {
        "containers": [
            {
                "name": "main",
                "image": "example.invalid/app",
                "resources": {"claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    kube.create(path("v1", "pods", namespace=namespace), {"metadata": {"name": name}, "spec": spec})


def pod(kube: Kube, namespace: str, name: str) -> JSON | None:
    return kube.get_or_none(path("v1", "pods", name, namespace=namespace))


def wait_running(kube: Kube, namespace: str, name: str) -> JSON:
    def running() -> JSON | None:
        p = pod(kube, namespace, name)
        return p if p and p.get("status", {}).get("phase") == "Running" else None

    return wait_for(
        running, 60, f"pod {name} to run", describe=lambda: json.dumps(pod(kube, namespace, name))
    )


def claim(kube: Kube, namespace: str, name: str) -> JSON:
    return kube.get(path(RESOURCE, "resourceclaims", name, namespace=namespace))


def cdi_env(n: Node, claim_uid: str) -> dict[str, str]:
    spec = json.loads((n.kubelet.cdi_dir / spec_file_name(claim_uid)).read_text())
    (dev,) = spec["devices"]
    return dict(e.split("=", 1) for e in dev["containerEdits"]["env"])


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
        wait_registered(n)
        wait_published(kube_json, n, {"gpu-0"})

    create_claim_pod(kube_json, namespace, "one", node=a.name)
    create_claim_pod(kube_json, namespace, "two", node=b.name)
    for name, n in (("one", a), ("two", b)):
        p = wait_running(kube_json, namespace, name)
        assert p["spec"]["nodeName"] == n.name  # bound by the real scheduler
        c = claim(kube_json, namespace, name)
        (res,) = c["status"]["allocation"]["devices"]["results"]
        assert (res["driver"], res["pool"], res["device"]) == (DRIVER, n.name, "gpu-0")
        env = cdi_env(n, c["metadata"]["uid"])
        assert env["COMPOSABLE_GPU_UUIDS"] == f"GPU-{n.name}-0"
        assert env["COMPOSABLE_GPU_CLAIM_UID"] == c["metadata"]["uid"]
        ids = n.kubelet.prepared_devices(p["metadata"]["uid"])[c["metadata"]["uid"]]
        assert ids and all(resolve(n.kubelet.cdi_dir, i) for i in ids)

    # Kill node a's plugin between prepare and unprepare, and start it again.
    claim_one = claim(kube_json, namespace, "one")["metadata"]["uid"]
    spec_path = a.kubelet.cdi_dir / spec_file_name(claim_one)
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
    (slice_after,) = node_slices(kube_json, a.name)
    assert slice_after["metadata"]["resourceVersion"] == slice_before["metadata"]["resourceVersion"]
    assert (spec_path.read_bytes(), spec_path.stat().st_mtime_ns) == spec_before

    # Deleting the pod unprepares through the restarted plugin: spec and checkpoint go.
    kube_json.delete(path("v1", "pods", "one", namespace=namespace))
    wait_for(
        lambda: pod(kube_json, namespace, "one") is None,
        60,
        "pod one to go",
        describe=a.plugin.log_tail,
    )
    assert not spec_path.exists()
    checkpoint = json.loads((a.plugin.state_dir / "checkpoint.json").read_text())
    assert claim_one not in checkpoint["data"]["claims"]
    assert a.plugin.logged("claim unprepared")

    # The freed device is prepared again for a new pod on the same node.
    create_claim_pod(kube_json, namespace, "three", node=a.name)
    wait_running(kube_json, namespace, "three")


def test_added_device_makes_pending_pod_schedulable(
    kube_json: Kube, make_node: Callable[[str, int], Node], device_class: str, namespace: str
) -> None:
    n = make_node("grow", 0)
    wait_registered(n)
    wait_for(lambda: n.plugin.logged("slices in sync"), 30, "the empty pool")
    create_claim_pod(kube_json, namespace, "waits", node=n.name)

    def unschedulable() -> bool:
        p = pod(kube_json, namespace, "waits") or {}
        conds = p.get("status", {}).get("conditions", [])
        return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)

    wait_for(unschedulable, 30, "the pod to be found unschedulable")
    n.set_devices(1)
    p = wait_running(kube_json, namespace, "waits")
    assert p["spec"]["nodeName"] == n.name
