"""One real node: the upstream kubelet, containerd v2 and runc, with our plugin beside them.

The example's claim and pod (deploy/examples/plugin-static.yaml) run on it: the pod's
container really starts, and its own output shows the environment that containerd
injected from the plugin's CDI spec. Deleting the pod makes the kubelet call
NodeUnprepareResources, which removes the spec.
"""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
import yaml

from composable_dra.k8s.kube import JSON, Conflict, Kube, NotFound, path
from dra_driver.cdi import spec_file_name
from testbed import examples
from testbed.plugin_process import write_static_devices
from testbed.realnode import RealNode
from testbed.wait import wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = "plugin-static"


def example_objects(node: str, image: str) -> tuple[list[JSON], list[JSON], JSON]:
    """The example's DeviceClass and claim template as they are, its static devices, and
    its pod adapted to a real node: the local image, pinned to the node, printing its whole
    environment (in the node's pod network)."""
    docs = examples.load(EXAMPLE)
    kept = [d for d in docs if d["kind"] in ("DeviceClass", "ResourceClaimTemplate")]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    devices: list[JSON] = yaml.safe_load(cm["data"]["devices.yaml"])["devices"]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    spec = pod["spec"]
    spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    spec["dnsPolicy"] = "Default"  # no cluster DNS on the test nodes
    spec["terminationGracePeriodSeconds"] = 1
    (container,) = spec["containers"]
    container["image"] = image
    container["command"] = ["sh", "-c", "env; exec sleep 3600"]
    return kept, devices, pod


# Long because it is one scenario read top to bottom; its steps share what it built.
def test_example_pod_runs_with_cdi_env(
    real_node: RealNode, kube_json: Kube, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {what}", flush=True)

    kept, devices, pod = example_objects(real_node.name, real_node.image)
    gpu_uuid = f"GPU-{uuid.uuid4()}"
    devices = [{**devices[0], "uuid": gpu_uuid}]
    assert real_node.plugin is not None
    write_static_devices(real_node.plugin.static_file, devices)
    real_node.start_plugin()
    mark("plugin registered with the kubelet")

    for obj in kept:
        ns = None if obj["kind"] == "DeviceClass" else namespace
        plural = "deviceclasses" if obj["kind"] == "DeviceClass" else "resourceclaimtemplates"
        with contextlib.suppress(Conflict):  # the DeviceClass may exist from another test
            kube_json.create(path(obj["apiVersion"], plural, namespace=ns), obj)
    pod_name = pod["metadata"]["name"]
    kube_json.create(path("v1", "pods", namespace=namespace), pod)
    pod_path = path("v1", "pods", pod_name, namespace=namespace)

    def running() -> bool:
        real_node.check_alive()
        got = kube_json.get(pod_path)
        return bool(got["status"].get("phase") == "Running")

    wait_for(
        running,
        90,
        f"pod {pod_name} to run on {real_node.name}",
        interval=0.3,
        describe=lambda: f"{kube_json.get(pod_path).get('status')}\n{real_node.logs_tail(15)}",
    )
    mark("pod running")
    got = kube_json.get(pod_path)
    (status,) = got["status"]["resourceClaimStatuses"]
    claim = kube_json.get(
        path(
            "resource.k8s.io/v1", "resourceclaims", status["resourceClaimName"], namespace=namespace
        )
    )
    spec_file = real_node.cdi_dir / spec_file_name(claim["metadata"]["uid"])
    assert spec_file.exists()

    # The container's own output: what containerd injected from the plugin's CDI spec.
    def printed_env() -> str | None:
        log = real_node.container_log(namespace, pod_name, "main")
        return log if "COMPOSABLE_GPU_UUIDS=" in log else None

    output = wait_for(printed_env, 30, "the container's output", describe=real_node.logs_tail)
    with capsys.disabled():  # into the test log of every run: what the container saw
        print(f"\n--- output of {namespace}/{pod_name} on real node {real_node.name} ---")
        print("\n".join(line for line in output.splitlines() if "GPU" in line or "DEMO" in line))
    env = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
    assert env["COMPOSABLE_GPU_UUIDS"] == gpu_uuid
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpu_uuid
    assert env["COMPOSABLE_GPU_CLAIM_UID"] == claim["metadata"]["uid"]
    assert env["DEMO"] == "1"  # the claim's opaque config, through the same spec

    # Deleting the pod: the kubelet stops the container and calls NodeUnprepareResources.
    mark("container output read")
    plugin = real_node.plugin
    assert not plugin.logged("claim unprepared")
    kube_json.delete(pod_path)
    wait_for(
        lambda: not spec_file.exists() and plugin.logged("claim unprepared"),
        60,
        "NodeUnprepareResources (the CDI spec removed) after the pod's deletion",
        interval=0.3,
        describe=real_node.logs_tail,
    )
    mark("claim unprepared, CDI spec removed")

    def pod_gone() -> bool:
        try:
            kube_json.get(pod_path)
        except NotFound:
            return True
        return False

    wait_for(pod_gone, 30, f"pod {pod_name} to be gone", interval=0.3)
    mark("pod gone")
