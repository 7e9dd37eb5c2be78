"""Each example in deploy/examples, applied as a user would, on the whole suite.

No node has a GPU of its own: every example is served through the attach flow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra import names
from composable_dra.kube import JSON, Kube
from hack import examples
from hack.localcluster import ControlPlane
from hack.localcluster.harness import Suite, SuiteOptions
from hack.localcluster.wait import wait_for
from tests.e2e.claims_seen import ClaimsSeen

pytestmark = pytest.mark.e2e


@pytest.fixture
def suite(kube_json: Kube, control_plane: ControlPlane, short_tmp: Path) -> Iterator[Suite]:
    # A fresh suite per example: no GPU is on any node yet, so each claim is served
    # through the attach flow (a shared suite would hand out GPUs released earlier).
    s = Suite(kube_json, control_plane.kubeconfig, short_tmp, SuiteOptions())
    s.start()
    yield s
    s.stop()


def run_example(suite: Suite, name: str, namespace: str) -> dict[str, JSON]:
    examples.apply(suite.kube, name, namespace)
    names_ = examples.pods(name)
    wait_for(
        lambda: all(suite.running(namespace, p) for p in names_),
        90,
        f"the pods of {name} to run",
        describe=suite.describe,
    )
    return {pod: suite.pod(namespace, pod) for pod in names_}


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


def test_prefer_local_fallback_pool(suite: Suite, namespace: str) -> None:
    pods = run_example(suite, "prefer-local-fallback-pool", namespace)
    claim = claim_of(suite, pods["gpu-prefer-local"])
    [result] = claim["status"]["allocation"]["devices"]["results"]
    # No node had a GPU of its own: the pool subrequest served it, through an attach.
    assert result["request"] == "gpu/pool"
    assert result["pool"].startswith(f"{suite.fabric}/")
    assert ready(claim) == [result["device"]]
    assert suite.composed()[result["device"]] == suite.host_of_node(
        pods["gpu-prefer-local"]["spec"]["nodeName"]
    )


def test_pool_only(suite: Suite, namespace: str) -> None:
    pods = run_example(suite, "pool-only", namespace)
    claim = claim_of(suite, pods["gpu-from-pool"])
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"].startswith(f"{suite.fabric}/")
    assert suite.composed()[result["device"]] == suite.host_of_node(
        pods["gpu-from-pool"]["spec"]["nodeName"]
    )


def test_two_gpus_in_one_claim(suite: Suite, namespace: str) -> None:
    pods = run_example(suite, "two-gpus", namespace)
    pod = pods["two-gpus"]
    claim = claim_of(suite, pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and len({r["device"] for r in results}) == 2
    host = suite.host_of_node(pod["spec"]["nodeName"])
    composed = suite.composed()
    assert all(composed[r["device"]] == host for r in results)
    assert sorted(ready(claim)) == sorted(r["device"] for r in results)


def test_one_claim_shared_by_two_pods(suite: Suite, namespace: str) -> None:
    before = set(suite.composed())
    pods = run_example(suite, "shared-claim", namespace)
    a, b = pods["shared-gpu-a"], pods["shared-gpu-b"]
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"]  # a claim binds to one node
    claim = suite.claim(namespace, "shared-gpu")
    assert {r["name"] for r in claim["status"]["reservedFor"]} == {"shared-gpu-a", "shared-gpu-b"}
    [result] = claim["status"]["allocation"]["devices"]["results"]
    attached = set(suite.composed()) - before
    assert attached == {result["device"]}  # one attach serves both pods
    uids = {p["metadata"]["uid"] for p in (a, b)}
    node = next(n for n in suite.nodes.values() if n.name == a["spec"]["nodeName"])
    prepared = [node.kubelet.prepared_devices(uid) for uid in uids]
    assert prepared[0] == prepared[1] and prepared[0]  # the same CDI devices in both


def finished(suite: Suite, namespace: str, name: str) -> bool:
    return suite.pod(namespace, name).get("status", {}).get("phase") in ("Succeeded", "Failed")


def test_prefer_local_pool_remote(suite: Suite, namespace: str) -> None:
    """No node has a GPU and none lends one: the pool subrequest serves it, and the
    pod's own process (the matmul workload) computes on its node and succeeds."""
    seen = ClaimsSeen(suite.kube, namespace)
    examples.apply(suite.kube, "prefer-local-pool-remote", namespace)
    [name] = examples.pods("prefer-local-pool-remote")
    wait_for(
        lambda: finished(suite, namespace, name), 120, f"{name} to finish", describe=suite.describe
    )
    pod = suite.pod(namespace, name)
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = wait_for(lambda: seen.allocated(claim_name), 30, "the claim's allocation seen")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/pool"
    node = next(n for n in suite.nodes.values() if n.name == pod["spec"]["nodeName"])
    log = node.kubelet.container_log(pod["metadata"]["uid"], "main")
    assert pod["status"]["phase"] == "Succeeded", log
    out = json.loads(log.strip().splitlines()[-1])
    assert out["ok"] is True and out["where"] == "local" and out["calls"] == 8
