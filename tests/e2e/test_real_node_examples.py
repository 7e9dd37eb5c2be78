"""deploy/examples on a real node: the upstream kubelet, containerd
and runc run each example's pods, and each container's own output shows the GPU that
containerd injected from the plugin's CDI spec.

The node has GPUs of its own (the static device source); the examples through the attach
flow, on real nodes too, are tests/e2e/test_examples.py.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest

from composable_dra.k8s.kube import JSON, Conflict, Kube, path
from dra_driver.cdi import spec_file_name
from testbed import examples
from testbed.objects import ensure_device_class
from testbed.plugin_process import write_static_devices
from testbed.realnode import RealNode
from testbed.realnode_pods import for_real_node
from testbed.realnodes import (
    RESOURCE,
    gone,
    printed_gpus,
    wait_running,
)
from testbed.wait import wait_for

pytestmark = pytest.mark.e2e

PREPARED_OK = "composable_dra_plugin_prepare_seconds_count"
_PLURALS = {"ResourceClaimTemplate": "resourceclaimtemplates", "ResourceClaim": "resourceclaims"}


def with_gpus(node: RealNode, n: int) -> list[str]:
    """Give the node ``n`` GPUs of its own and start its plugin; their UUIDs."""
    uuids = [f"GPU-{uuid.uuid4()}" for _ in range(n)]
    assert node.plugin is not None
    write_static_devices(
        node.plugin.static_file,
        [{"uuid": u, "productName": "Test GPU", "model": "T", "memory": "16Gi"} for u in uuids],
    )
    node.start_plugin()
    return uuids


def apply_on(kube: Kube, node: RealNode, example: str, namespace: str) -> list[str]:
    """Create the example's objects, its pods made to run on ``node``; the pods' names."""
    ensure_device_class(kube)
    pods = []
    for obj in examples.load(example):
        kind = obj["kind"]
        if kind == "Pod":
            pod = for_real_node(obj, node.name, node.image)
            kube.create(path("v1", "pods", namespace=namespace), pod)
            pods.append(pod["metadata"]["name"])
        elif kind == "DeviceClass":
            with contextlib.suppress(Conflict):
                kube.create(path(RESOURCE, "deviceclasses"), obj)
        else:
            kube.create(path(RESOURCE, _PLURALS[kind], namespace=namespace), obj)
    assert pods, f"example {example} has no pod"
    return pods


def claim_of(kube: Kube, pod: JSON) -> JSON:
    (status,) = pod["status"]["resourceClaimStatuses"]
    name = status.get("resourceClaimName")
    return kube.get(path(RESOURCE, "resourceclaims", name, namespace=pod["metadata"]["namespace"]))


@pytest.mark.versions("1.35", "1.36")
def test_prefer_local_on_a_real_node(real_node: RealNode, kube_json: Kube, namespace: str) -> None:
    (gpu,) = with_gpus(real_node, 1)
    (pod_name,) = apply_on(kube_json, real_node, "prefer-local-fallback-pool", namespace)
    pod = wait_running(kube_json, real_node, namespace, pod_name)
    claim = claim_of(kube_json, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    # The node's own GPU: the first subrequest, from the node's pool.
    assert result["request"] == "gpu/local"
    assert result["pool"] == real_node.name
    assert printed_gpus(real_node, namespace, pod_name) == gpu
    assert (real_node.cdi_dir / spec_file_name(claim["metadata"]["uid"])).exists()


@pytest.mark.versions("1.35", "1.36")
def test_shared_claim_on_a_real_node(real_node: RealNode, kube_json: Kube, namespace: str) -> None:
    gpus = with_gpus(real_node, 2)
    pods = apply_on(kube_json, real_node, "shared-claim", namespace)
    assert sorted(pods) == ["shared-gpu-a", "shared-gpu-b"]
    for p in pods:
        wait_running(kube_json, real_node, namespace, p)
    printed = {p: printed_gpus(real_node, namespace, p) for p in pods}
    # Both containers got the same one GPU. The claim was prepared once: the kubelet may
    # call NodePrepareResources for each pod (both pods synced at once), and a repeated
    # call is answered from the plugin's checkpoint.
    assert printed["shared-gpu-a"] == printed["shared-gpu-b"] and printed["shared-gpu-a"] in gpus
    assert real_node.plugin_events("claim prepared") == 1
    assert real_node.plugin_metric(PREPARED_OK, result="ok") >= 1
    assert real_node.plugin_metric(PREPARED_OK, result="error") == 0
    claim = kube_json.get(path(RESOURCE, "resourceclaims", "shared-gpu", namespace=namespace))
    spec_file = real_node.cdi_dir / spec_file_name(claim["metadata"]["uid"])
    assert spec_file.exists()

    # The first pod goes: the claim stays prepared for the other one.
    a_path = path("v1", "pods", "shared-gpu-a", namespace=namespace)
    kube_json.delete(a_path)
    wait_for(gone(kube_json, a_path), 60, "shared-gpu-a to be gone", interval=0.3)
    assert real_node.plugin_events("claim unprepared") == 0
    assert spec_file.exists()
    b = kube_json.get(path("v1", "pods", "shared-gpu-b", namespace=namespace))
    assert b["status"]["phase"] == "Running"

    # The last pod goes: now the kubelet unprepares the claim.
    kube_json.delete(path("v1", "pods", "shared-gpu-b", namespace=namespace))
    wait_for(
        lambda: real_node.plugin_events("claim unprepared") == 1 and not spec_file.exists(),
        60,
        "NodeUnprepareResources after the claim's last pod",
        interval=0.3,
        describe=real_node.logs_tail,
    )
