"""The kubelet emulator runs a pod's containers as processes with their CDI edits.

The plugin's example claim (deploy/examples/plugin-static.yaml: one GPU, env from its
opaque config) on a node with one static GPU; the pod's process prints what its CDI
spec gave it, and its exit code becomes the pod's phase.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from testbed import ControlPlane, examples
from testbed.kubelet_emulator import KubeletEmulator
from testbed.nodes import create_node, delete_node
from testbed.plugin_process import PluginProcess, write_static_devices
from testbed.suite_nodes import wait_plugin_registered
from testbed.wait import wait_for
from tests.e2e.test_plugin import RESOURCE, gpu

pytestmark = pytest.mark.e2e


@dataclass
class Node:
    """A fake node: the kubelet emulator (a test of it) and the plugin beside it."""

    name: str
    kubelet: KubeletEmulator
    plugin: PluginProcess


@pytest.fixture
def make_node(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> Iterator[Callable[[str, int], Node]]:
    nodes: list[Node] = []

    def make(suffix: str, devices: int) -> Node:
        name = f"{suffix}-{unique}"
        create_node(kube_json.api, name)
        root = short_tmp / suffix
        kubelet = KubeletEmulator(kube_json, name, root / "kubelet", root / "cdi")
        kubelet.start()
        plugin = PluginProcess.beside(kubelet, name, control_plane.kubeconfig, root / "plugin")
        write_static_devices(plugin.static_file, [gpu(name, i) for i in range(devices)])
        plugin.start()
        nodes.append(Node(name, kubelet, plugin))
        return nodes[-1]

    yield make
    for n in nodes:
        n.plugin.stop()
        n.kubelet.stop()
        delete_node(kube_json.api, n.name)


def wait_registered(n: Node) -> None:
    wait_plugin_registered(n.kubelet, n.plugin, n.name, 30)


def example(kind: str) -> JSON:
    return copy.deepcopy(next(o for o in examples.load("plugin-static") if o["kind"] == kind))


def run_pod(kube: Kube, namespace: str, node: str, name: str, script: str) -> JSON:
    pod = example("Pod")
    pod["metadata"]["name"] = name
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["terminationGracePeriodSeconds"] = 1
    pod["spec"]["containers"][0]["command"] = ["sh", "-c", script]
    created: JSON = kube.create(path("v1", "pods", namespace=namespace), pod)
    return created


def phase(kube: Kube, namespace: str, name: str) -> str:
    pod = kube.get(path("v1", "pods", name, namespace=namespace))
    return str(pod.get("status", {}).get("phase", ""))


def test_the_process_sees_its_cdi_env_and_its_exit_is_the_phase(
    kube_json: Kube,
    namespace: str,
    device_class: str,
    make_node: Callable[[str, int], Node],
) -> None:
    node = make_node("runs", 1)
    wait_registered(node)
    kube_json.create(
        path(RESOURCE, "resourceclaimtemplates", namespace=namespace),
        example("ResourceClaimTemplate"),
    )
    pod = run_pod(
        kube_json,
        namespace,
        node.name,
        "fails",
        'echo "uuids=$COMPOSABLE_GPU_UUIDS demo=$DEMO"; exit 3',
    )
    wait_for(
        lambda: phase(kube_json, namespace, "fails") == "Failed",
        60,
        "the pod whose process exits 3 to fail",
        describe=node.plugin.log_tail,
    )
    status = kube_json.get(path("v1", "pods", "fails", namespace=namespace))["status"]
    [container] = status["containerStatuses"]
    assert container["state"]["terminated"]["exitCode"] == 3
    assert container["state"]["terminated"]["reason"] == "Error"
    # The env came from the CDI spec the plugin wrote for the prepared GPU.
    log = node.kubelet.container_log(pod["metadata"]["uid"], "main")
    assert log == f"uuids=GPU-{node.name}-0 demo=1\n"

    # A process that waits runs until its pod is deleted; its exit 0 would be Succeeded.
    kube_json.delete(path("v1", "pods", "fails", namespace=namespace))
    waiting = run_pod(
        kube_json, namespace, node.name, "waits", 'echo "$$" > pid; echo started; exec sleep 300'
    )
    uid = waiting["metadata"]["uid"]
    wait_for(
        lambda: (
            node.kubelet.container_log(uid, "main") == "started\n"
            and phase(kube_json, namespace, "waits") == "Running"
        ),
        60,
        "the waiting pod to run",
        describe=node.plugin.log_tail,
    )
    pid_file = node.kubelet.containers.root / uid / "main" / "rootfs" / "pid"
    pid = int(pid_file.read_text())
    assert Path(f"/proc/{pid}").exists()
    kube_json.delete(path("v1", "pods", "waits", namespace=namespace))
    wait_for(
        lambda: kube_json.get_or_none(path("v1", "pods", "waits", namespace=namespace)) is None,
        60,
        "the deleted pod to go",
    )
    assert not Path(f"/proc/{pid}").exists()
