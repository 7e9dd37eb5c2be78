"""Each example in deploy/examples, applied as a user would, on the whole suite with real
nodes (the upstream kubelet, containerd, runc): each container prints the GPUs that
containerd injected from the plugin's CDI spec.

No node has a GPU of its own: every example is served through the attach flow. (The
examples on a node with GPUs of its own: tests/e2e/test_real_node_examples.py.)
"""

from __future__ import annotations

import json

import pytest

from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from testbed import examples
from testbed.harness import Suite
from testbed.realnode_pods import for_real_node
from testbed.realnodes import describe_nodes, printed_gpus
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite, SeeClaims

pytestmark = pytest.mark.e2e


def run_example(
    make_suite: MakeSuite, name: str, namespace: str, hosts: tuple[str, ...] = ("node-1",)
) -> tuple[Suite, dict[str, JSON]]:
    """A fresh suite of real nodes on ``hosts`` (no GPU is on any node yet, so each claim
    is served through the attach flow), the example applied, its pods running."""
    suite = make_suite(hosts=hosts, real_hosts=hosts)
    image = next(iter(suite.real_nodes.values())).image
    examples.apply(
        suite.kube, name, namespace, pod=lambda p: suite.on_own_nodes(for_real_node(p, None, image))
    )
    names_ = examples.pods(name)
    wait_for(
        lambda: all(suite.running(namespace, p) for p in names_),
        120,
        f"the pods of {name} to run",
        describe=lambda: describe_nodes(suite),
    )
    return suite, {pod: suite.pod(namespace, pod) for pod in names_}


def claim_of(suite: Suite, pod: JSON) -> JSON:
    statuses = pod["status"].get("resourceClaimStatuses") or []
    name = (
        statuses[0]["resourceClaimName"]
        if statuses
        else pod["spec"]["resourceClaims"][0]["resourceClaimName"]
    )
    return suite.claim(pod["metadata"]["namespace"], name)


def ready(claim: JSON) -> list[str]:
    return [
        d["device"]
        for d in claim["status"].get("devices", [])
        if any(
            c["type"] == names.FABRIC_DEVICE_READY and c["status"] == "True"
            for c in d.get("conditions", [])
        )
    ]


def assert_attached(suite: Suite, pod: JSON, claim: JSON) -> list[JSON]:
    """Every device of the claim came from the fabric's pool, attached to the pod's host
    (FabricDeviceReady), and the container printed their UUIDs; the claim's results."""
    results: list[JSON] = claim["status"]["allocation"]["devices"]["results"]
    host = suite.host_of_node(pod["spec"]["nodeName"])
    composed = suite.composed()
    for r in results:
        assert r["pool"].startswith(f"{suite.fabric}/")
        assert composed[r["device"]] == host
    assert sorted(ready(claim)) == sorted(r["device"] for r in results)
    node = suite.real_nodes[host]
    printed = printed_gpus(node, pod["metadata"]["namespace"], pod["metadata"]["name"])
    want = {d["data"]["uuid"] for d in claim["status"]["devices"]}
    assert set(printed.split(",")) == want and len(want) == len(results)
    return results


def test_prefer_local_fallback_pool(make_suite: MakeSuite, namespace: str) -> None:
    suite, pods = run_example(make_suite, "prefer-local-fallback-pool", namespace)
    pod = pods["gpu-prefer-local"]
    [result] = assert_attached(suite, pod, claim_of(suite, pod))
    # No node had a GPU of its own: the pool subrequest served it, through an attach.
    assert result["request"] == "gpu/pool"


@pytest.mark.versions("1.36", gated=("1.35",))
def test_pool_only(make_suite: MakeSuite, namespace: str) -> None:
    suite, pods = run_example(make_suite, "pool-only", namespace)
    pod = pods["gpu-from-pool"]
    [_] = assert_attached(suite, pod, claim_of(suite, pod))


def test_two_gpus_in_one_claim(make_suite: MakeSuite, namespace: str) -> None:
    suite, pods = run_example(make_suite, "two-gpus", namespace)
    pod = pods["two-gpus"]
    results = assert_attached(suite, pod, claim_of(suite, pod))
    assert len(results) == 2 and len({r["device"] for r in results}) == 2


def test_one_claim_shared_by_two_pods(make_suite: MakeSuite, namespace: str) -> None:
    # Two nodes: the second pod must follow the claim to the node of the first.
    suite, pods = run_example(make_suite, "shared-claim", namespace, hosts=("node-1", "node-2"))
    a, b = pods["shared-gpu-a"], pods["shared-gpu-b"]
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"]  # a claim binds to one node
    claim = suite.claim(namespace, "shared-gpu")
    assert {r["name"] for r in claim["status"]["reservedFor"]} == {"shared-gpu-a", "shared-gpu-b"}
    # One attach serves both pods, and both containers got the same GPU.
    for pod in (a, b):
        [result] = assert_attached(suite, pod, claim)
    assert set(suite.composed()) == {result["device"]}


def test_prefer_local_pool_remote(
    make_suite: MakeSuite, namespace: str, claims_seen: SeeClaims
) -> None:
    """No node has a GPU and none lends one: the pool subrequest serves it, and the
    pod's own process (the matmul workload) computes on its node and succeeds.

    Kubelet emulators: the workload is Python with numpy, which the real nodes' test
    image (a shell and three tools) cannot run."""
    suite = make_suite()
    seen = claims_seen(suite.kube, namespace)
    examples.apply(suite.kube, "prefer-local-pool-remote", namespace)
    [name] = examples.pods("prefer-local-pool-remote")
    pod = seen.wait_pod_ended(name, 120, describe=suite.describe)
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = seen.wait_allocated(claim_name, "the claim's allocation seen")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/pool"
    node = next(n for n in suite.nodes.values() if n.name == pod["spec"]["nodeName"])
    log = node.kubelet.container_log(pod["metadata"]["uid"], "main")
    assert pod["status"]["phase"] == "Succeeded", log
    out = json.loads(log.strip().splitlines()[-1])
    assert out["ok"] is True and out["where"] == "local" and out["calls"] == 8
