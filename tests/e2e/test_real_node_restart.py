"""What only a real kubelet shows about restarts.

- The kubelet deletes every ResourceSlice of its node when it starts; the plugin, still
  running, publishes the same devices again. It deletes a driver's slices 30 s after the
  driver unregisters; the plugin, back, publishes them again.
- A kubelet restart does not prepare a running pod's claim again: the kubelet keeps its
  own checkpoint of prepared claims, the container keeps running, the CDI spec stays.
"""

from __future__ import annotations

import time
import uuid

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from dra_driver.cdi import spec_file_name
from testbed.objects import ensure_device_class
from testbed.plugin_process import write_static_devices
from testbed.realnode import RealNode
from testbed.realnodes import (
    RESOURCE,
    node_slices,
    pod_with_claim,
    slice_devices,
    wait_output,
    wait_running,
)
from testbed.wait import wait_for

pytestmark = pytest.mark.e2e

PREPARED_OK = "composable_dra_plugin_prepare_seconds_count"


def gpus(n: int) -> list[JSON]:
    return [
        {"uuid": f"GPU-{uuid.uuid4()}", "productName": "Test GPU", "model": "T", "memory": "16Gi"}
        for _ in range(n)
    ]


def start_plugin(node: RealNode, devices: list[JSON]) -> None:
    assert node.plugin is not None
    write_static_devices(node.plugin.static_file, devices)
    node.start_plugin()


def test_slices_wiped_at_kubelet_start_are_republished(
    real_node: RealNode, kube_json: Kube
) -> None:
    start_plugin(real_node, gpus(2))
    before = wait_for(
        lambda: node_slices(kube_json, real_node.name) or None,
        30,
        "the plugin's slices",
        describe=real_node.logs_tail,
    )
    devices = slice_devices(before)
    assert len(devices) == 2
    old_uids = {s["metadata"]["uid"] for s in before}

    t0 = time.monotonic()
    real_node.restart_kubelet()
    real_node.wait_plugin_registered(2)

    def republished() -> list[JSON] | None:
        now = node_slices(kube_json, real_node.name)
        uids = {s["metadata"]["uid"] for s in now}
        # New objects (the kubelet deleted the old ones) with the same devices.
        return now if now and not uids & old_uids and slice_devices(now) == devices else None

    after = wait_for(
        republished,
        30,
        "the plugin to republish the slices the restarted kubelet deleted",
        interval=0.2,
        describe=lambda: f"{node_slices(kube_json, real_node.name)}\n{real_node.logs_tail()}",
    )
    print(f"slices republished {time.monotonic() - t0:.1f}s after the kubelet restart")
    assert {s["spec"]["driver"] for s in after} == {names.DRIVER}
    assert real_node.plugin is not None and real_node.plugin.starts == 1


def test_slices_wiped_after_unregistration_are_republished(
    real_node: RealNode, kube_json: Kube
) -> None:
    """The plugin away (a DaemonSet rollout): the kubelet unregisters it and, 30 s later,
    deletes its slices; the plugin back publishes the same devices again."""
    start_plugin(real_node, gpus(2))
    before = wait_for(
        lambda: node_slices(kube_json, real_node.name) or None, 30, "the plugin's slices"
    )
    devices = slice_devices(before)
    plugin = real_node.plugin
    assert plugin is not None and len(devices) == 2
    assert plugin.stop() == 0
    t0 = time.monotonic()
    # The plugin leaves its slices behind; the kubelet removes them after its grace period.
    assert slice_devices(node_slices(kube_json, real_node.name)) == devices
    wait_for(
        lambda: not node_slices(kube_json, real_node.name),
        60,
        "the kubelet to delete the slices of the unregistered driver",
        interval=0.5,
        describe=real_node.logs_tail,
    )
    waited = time.monotonic() - t0
    print(f"slices deleted {waited:.1f}s after the plugin stopped")
    assert waited > 20, "deleted before the kubelet's 30 s grace: not the kubelet's wipe"
    real_node.start_plugin()
    after = wait_for(
        lambda: node_slices(kube_json, real_node.name) or None,
        30,
        "the plugin to publish its slices again",
        describe=real_node.logs_tail,
    )
    assert slice_devices(after) == devices


def test_kubelet_restart_does_not_prepare_again(
    real_node: RealNode, kube_json: Kube, namespace: str
) -> None:
    devices = gpus(2)
    start_plugin(real_node, devices)

    ensure_device_class(kube_json)
    pod_with_claim(kube_json, real_node, namespace, "first")
    first = wait_running(kube_json, real_node, namespace, "first")
    wait_output(real_node, namespace, "first", "COMPOSABLE_GPU_UUIDS=")
    claim = kube_json.get(path(RESOURCE, "resourceclaims", "first", namespace=namespace))
    spec_file = real_node.cdi_dir / spec_file_name(claim["metadata"]["uid"])
    assert spec_file.exists()
    assert real_node.plugin_metric(PREPARED_OK, result="ok") == 1
    (container,) = first["status"]["containerStatuses"]

    real_node.restart_kubelet()
    real_node.wait_plugin_registered(2)
    # A second pod after the restart: once it runs, the restarted kubelet has synced
    # every pod it found at start-up, the first one included.
    pod_with_claim(kube_json, real_node, namespace, "second")
    wait_running(kube_json, real_node, namespace, "second")

    # One prepare call for each claim: none again for the first.
    assert real_node.plugin_metric(PREPARED_OK, result="ok") == 2
    assert real_node.plugin_events("claim prepared") == 2
    got = kube_json.get(path("v1", "pods", "first", namespace=namespace))
    assert got["status"]["phase"] == "Running"
    (now,) = got["status"]["containerStatuses"]
    assert now["containerID"] == container["containerID"] and now["restartCount"] == 0
    assert spec_file.exists()
    assert real_node.plugin_events("claim unprepared") == 0
