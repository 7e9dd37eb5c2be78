"""The attach flow with a real kubelet: a node with no GPU of its own
runs as a real node (the upstream kubelet, containerd, runc) whose kubelet reports the
systemUUID of an emulator host; a pod's claim is served from the fabric's pool, the
operator attaches the GPU to that host, the plugin (redfish device source) sees it and
prepares the claim, and the container's own output shows the attached GPU's UUID. The
examples that only the pool can serve (pool-only, two-gpus) run there the same way.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra import names
from composable_dra.kube import Kube, path
from dra_driver.cdi import spec_file_name
from hack.localcluster import ControlPlane
from hack.localcluster.harness import Suite, SuiteOptions
from hack.localcluster.wait import wait_for
from tests.e2e.realnodes import wait_output, wait_running

pytestmark = pytest.mark.e2e

HOST = "node-1"


@pytest.fixture
def suite(
    kube_json: Kube, control_plane: ControlPlane, node_bin_dir: Path, short_tmp: Path
) -> Iterator[Suite]:
    opts = SuiteOptions(hosts=(HOST,), real_hosts=(HOST,), node_bin_dir=node_bin_dir)
    s = Suite(kube_json, control_plane.kubeconfig, short_tmp, opts, control_plane=control_plane)
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_pool_gpu_attached_to_a_real_node(suite: Suite, namespace: str) -> None:
    t0 = time.monotonic()
    node = suite.real_nodes[HOST]
    assert suite.local_devices(HOST) == []  # no GPU of its own: only the pool can serve
    suite.create_pod(namespace, "p1", node=node.name)
    wait_running(suite.kube, node, namespace, "p1", timeout=120)
    print(f"pod running {time.monotonic() - t0:.1f}s after its creation", flush=True)

    claim = suite.claim(namespace, "p1")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/pool"
    assert result["pool"].startswith(f"{suite.fabric}/")
    assert suite.composed()[result["device"]] == HOST  # attached to the real node's host
    (status,) = [d for d in claim["status"]["devices"] if d["device"] == result["device"]]
    gpu_uuid = status["data"]["uuid"]

    out = wait_output(node, namespace, "p1", "COMPOSABLE_GPU_UUIDS=")
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    assert env["COMPOSABLE_GPU_UUIDS"] == gpu_uuid
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{gpu_uuid}"  # Redfish: bare UUID
    assert env["COMPOSABLE_GPU_CLAIM_UID"] == claim["metadata"]["uid"]

    # The pod goes: the real kubelet unprepares the claim.
    spec_file = node.cdi_dir / spec_file_name(claim["metadata"]["uid"])
    assert spec_file.exists()
    suite.kube.delete(path("v1", "pods", "p1", namespace=namespace))
    wait_for(
        lambda: not spec_file.exists() and node.plugin_events("claim unprepared") == 1,
        60,
        "NodeUnprepareResources after the pod's deletion",
        interval=0.3,
        describe=node.logs_tail,
    )
    assert result["driver"] == names.DRIVER


def test_pool_examples_on_a_real_node(suite: Suite, namespace: str) -> None:
    """deploy/examples/pool-only and two-gpus: every GPU attached to the real node's host
    through the fabric, and each container prints the UUIDs it received."""
    pods = [
        *suite.apply_example("pool-only", namespace, HOST),
        *suite.apply_example("two-gpus", namespace, HOST),
    ]
    assert sorted(pods) == ["gpu-from-pool", "two-gpus"]
    node = suite.real_nodes[HOST]
    composed: set[str] = set()
    for name in pods:
        pod = wait_running(suite.kube, node, namespace, name, timeout=120)
        (ref,) = pod["status"]["resourceClaimStatuses"]
        claim = suite.claim(namespace, ref["resourceClaimName"])
        results = claim["status"]["allocation"]["devices"]["results"]
        assert all(r["pool"].startswith(f"{suite.fabric}/") for r in results)
        attached = suite.composed()
        assert all(attached[r["device"]] == HOST for r in results)
        composed.update(r["device"] for r in results)
        want = {d["data"]["uuid"] for d in claim["status"]["devices"]}
        assert len(want) == len(results) == (2 if name == "two-gpus" else 1)
        out = wait_output(node, namespace, name, "GPUs: ")
        (line,) = [ln for ln in out.splitlines() if ln.startswith("GPUs: ")]
        assert set(line.removeprefix("GPUs: ").split(",")) == want
    assert len(composed) == 3
