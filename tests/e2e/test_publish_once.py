"""Each GPU published once under load: concurrent pool claims, every component a
process of its own on the real control plane, the Redfish emulator as the fabric, and
three real nodes (the upstream kubelet, containerd, runc) that prepare every claim.

The fabric shows an attached GPU on its node before the operator has recorded the GPU's
UUID on the ComposableResource: here each attach task ends on its own after 1 s while the
operator polls it every 3 s (``Retry-After``), as a fabric manager with a slow task monitor
would. Claims that arrive in that moment prefer a node's local GPUs (``firstAvailable``:
local, then the pool); none of them may be given a GPU that serves a pool claim.
"""

from __future__ import annotations

from typing import Any

import pytest

from composable_dra.k8s.kube import path
from hack.bench.time_to_gpu import block_uuids, final_allocations, shared_gpus
from testbed.harness import Suite
from testbed.realnodes import describe_nodes, suite_pod
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e

HOSTS = ("node-1", "node-2", "node-3")
WAVE = 12  # pods a wave; two waves


def topology(blocks: int) -> dict[str, Any]:
    return {
        "hosts": [{"id": h} for h in HOSTS],
        "zones": [
            {
                "id": "zone-1",
                "hosts": list(HOSTS),
                "blocks": [
                    {"id": f"gpu-{i + 1}", "model": "NVIDIA H100 80GB HBM3"} for i in range(blocks)
                ],
            }
        ],
    }


@pytest.fixture
def suite(make_suite: MakeSuite) -> Suite:
    return make_suite(
        hosts=HOSTS,
        real_hosts=HOSTS,
        topology=topology(2 * WAVE + 4),
        async_polls=1000,  # a task ends on its own (task_seconds), not by being polled
        retry_after=3,
        attach_latency=0,
    )


def allocated(suite: Suite, ns: str) -> dict[str, list[tuple[str, str]]]:
    return final_allocations(suite.kube, ns)


def shared(suite: Suite, ns: str) -> dict[str, list[str]]:
    """Physical GPU -> the claims allocated it, where more than one is."""
    return shared_gpus(allocated(suite, ns), block_uuids(suite))


def prepare_failures(suite: Suite, ns: str) -> list[str]:
    events = suite.kube.get(
        path("v1", "events", namespace=ns), fieldSelector="reason=FailedPrepareDynamicResources"
    )["items"]
    return [f"{e['involvedObject']['name']}: {e['message']}" for e in events]


def test_concurrent_pool_claims_never_get_one_gpu_twice(suite: Suite, namespace: str) -> None:
    # Shorter than the operator's poll: the GPU is on its node ~2 s before its UUID is known.
    suite.emulator.configure(task_seconds=1)
    pods = [f"p{i}" for i in range(2 * WAVE)]
    for name in pods[:WAVE]:
        suite_pod(suite, namespace, name)
    # The second wave arrives while the first wave's GPUs are appearing on the nodes.
    wait_for(lambda: suite.composed(), 90, "a first GPU attached", describe=suite.describe)
    for name in pods[WAVE:]:
        suite_pod(suite, namespace, name)

    wait_for(
        lambda: len(a := allocated(suite, namespace)) == len(pods) and all(a.values()),
        90,
        "every claim allocated",
        describe=suite.describe,
    )
    assert shared(suite, namespace) == {}
    wait_for(
        lambda: (
            all(suite.running(namespace, p) for p in pods) or prepare_failures(suite, namespace)
        ),
        150,
        "every pod running",
        describe=lambda: (
            describe_nodes(suite) + f"\nprepare failures: {prepare_failures(suite, namespace)}"
        ),
    )
    assert prepare_failures(suite, namespace) == []
    assert shared(suite, namespace) == {}
    assert all(suite.running(namespace, p) for p in pods)
    # Every pool claim's GPU is attached.
    pool_blocks = {d for rs in allocated(suite, namespace).values() for p, d in rs if "/" in p}
    assert set(suite.composed()) >= pool_blocks
