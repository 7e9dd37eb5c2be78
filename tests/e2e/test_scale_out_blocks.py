"""Functional blocks that scale out, on the real control plane: the example
``deploy/examples/scale-out-blocks.yaml`` on consumer node C, with donor A lending four GPUs.

The Deployment and ReplicaSet controllers make the block pods, the resourceclaim
controller a claim for each from the template, the scheduler gives each a remote GPU of
A, the lease controller a lease; C's kubelet emulator runs the pipeline's and each
block's process with their CDI edits. The HPA is applied server-side (the API server
validates it, and kube-controller-manager's HPA controller reads it: with no custom
metrics API here it reports that it cannot get the metric, and scales nothing). Scaling
out is done as the HPA would do it, through the Deployment's scale: from one block to
three, and the pipeline's own metrics show the work spread over all three, each block
named by its lease, every result right.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import urllib3
from prometheus_client.parser import text_string_to_metric_families

from composable_dra.k8s.kube import JSON, Kube, path
from testbed import examples
from testbed.controlplane import free_port
from testbed.wait import wait_for
from tests.e2e.test_remote_gpus import ready_leases
from tests.e2e.test_remote_lease import RemoteSetup

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("device_class")]
EXAMPLE = "scale-out-blocks"
BLOCKS = "reid-blocks"
GPUS = 4
FRAMES = 10  # each block's answered frames that count as "it took part"


def on_node(node: str, port: int) -> Callable[[JSON], JSON]:
    """The example's Deployments pinned to ``node``; the pipeline's Service address is the
    pipeline's port on this host (the emulator's pods share the host's network)."""

    def edit(obj: JSON) -> JSON:
        if obj["kind"] != "Deployment":
            return obj
        obj = copy.deepcopy(obj)
        spec = obj["spec"]["template"]["spec"]
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        spec["terminationGracePeriodSeconds"] = 2
        for c in spec["containers"]:
            c["args"] = [
                a.replace("0.0.0.0:7480", f"127.0.0.1:{port}").replace(
                    "http://reid-pipeline:7480", f"http://127.0.0.1:{port}"
                )
                for a in c["args"]
            ]
        return obj

    return edit


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The pipeline's metrics: name -> labels -> value."""
    resp = urllib3.PoolManager(retries=False, timeout=5).request(
        "GET", f"http://127.0.0.1:{port}/metrics"
    )
    text = resp.data.decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def by_block(port: int) -> dict[str, float]:
    frames = scrape(port).get("remote_gpu_pipeline_frames_total", {})
    return {dict(labels)["block"]: v for labels, v in frames.items()}


def block_leases(kube: Kube, ns: str) -> set[str]:
    """``lease-<id>`` of each running block pod's claim, as the lease controller wrote it."""
    pods = kube.get(path("v1", "pods", namespace=ns), labelSelector="app=reid-blocks")["items"]
    names = set()
    for pod in pods:
        for st in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            name = st["resourceClaimName"]
            claim = kube.get(path("resource.k8s.io/v1", "resourceclaims", name, namespace=ns))
            names |= {f"lease-{lease}" for lease in ready_leases(claim, 1).values()}
    return names


def test_blocks_scale_out_and_the_pipeline_spreads_its_frames_over_them(
    donor_of_four: RemoteSetup,
) -> None:
    remote = donor_of_four
    try:
        scale_out(remote, free_port())
    finally:  # the pods end before their node's plugin does
        for name in ("reid-pipeline", BLOCKS):
            remote.kube.delete(path("apps/v1", "deployments", name, namespace=remote.ns))


def scale_out(remote: RemoteSetup, port: int) -> None:
    kube, ns = remote.kube, remote.ns
    edit = on_node(remote.consumer, port)
    examples.apply(kube, EXAMPLE, ns, edit=edit, skip={"HorizontalPodAutoscaler"})
    [hpa] = [o for o in examples.load(EXAMPLE) if o["kind"] == "HorizontalPodAutoscaler"]
    hpa_path = examples.plural_path(hpa, ns, hpa["metadata"]["name"])
    applied = kube.apply(hpa_path, hpa, field_manager="scale-out-test")
    assert applied["spec"]["metrics"][0]["object"]["metric"]["name"] == (
        "remote_gpu_pipeline_queue_frames"
    )
    # One block takes every frame.
    wait_for(
        lambda: [v for v in by_block(port).values() if v >= FRAMES],
        120,
        "the first block to answer frames",
        describe=remote.describe,
    )
    [first] = by_block(port)
    # The HPA controller read the object and found no metric to act on.
    wait_for(
        lambda: any(
            c["type"] == "ScalingActive" and c["status"] == "False"
            for c in (kube.get(hpa_path).get("status") or {}).get("conditions") or []
        ),
        60,
        "the HPA controller's verdict on the metric",
    )
    scale = path("apps/v1", "deployments", BLOCKS, namespace=ns, subresource="scale")
    kube.merge_patch(scale, {"spec": {"replicas": 3}})
    wait_for(
        lambda: len([v for v in by_block(port).values() if v >= FRAMES]) == 3,
        180,
        "three blocks answering frames",
        describe=lambda: f"{by_block(port)}\n{remote.describe()}",
    )
    blocks = by_block(port)
    assert first in blocks and set(blocks) == block_leases(kube, ns), blocks
    metrics = scrape(port)
    assert not metrics.get("remote_gpu_errors_total"), metrics.get("remote_gpu_errors_total")
    assert "remote_gpu_pipeline_queue_frames" in metrics
    assert kube.get(path("apps/v1", "deployments", BLOCKS, namespace=ns))["spec"]["replicas"] == 3
