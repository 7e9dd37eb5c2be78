"""Must-show 1 with the pod's own process: node C (no GPU, no fabric reach) gets donor
A's GPU, and the pod's container, started by C's kubelet emulator as a local process with
the claim's CDI edits (env, the token file mounted under its root), runs the matmul
workload on the donor and checks every product against numpy.

Every component is its own process (the donor's plugin and donor, the scaler with its
lease controller, C's plugin, the workload); the setup is test_remote_lease's.
"""

from __future__ import annotations

import json

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from testbed.remote_pods import matmul_claim_and_pod
from testbed.wait import wait_for
from tests.e2e.conftest import SeeClaims
from tests.e2e.test_lend import CLASS
from tests.e2e.test_remote_lease import RemoteSetup, condition, device_status, remote

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("device_class")]
__all__ = ["remote"]  # the fixture this module uses
RESOURCE = "resource.k8s.io/v1"


def workload_pod(kube: Kube, ns: str, name: str, node: str, args: list[str]) -> JSON:
    claim, pod = matmul_claim_and_pod(name, node, args, CLASS)
    kube.create(path(RESOURCE, "resourceclaims", namespace=ns), claim)
    created: JSON = kube.create(path("v1", "pods", namespace=ns), pod)
    return created


def phase(kube: Kube, ns: str, name: str) -> str:
    pod = kube.get_or_none(path("v1", "pods", name, namespace=ns)) or {}
    return str((pod.get("status") or {}).get("phase", ""))


def test_the_pods_process_runs_matmul_on_the_donor(
    remote: RemoteSetup, claims_seen: SeeClaims
) -> None:
    kube, ns = remote.kube, remote.ns
    seen = claims_seen(kube, ns)
    pod = workload_pod(kube, ns, "matmul", remote.consumer, ["--size", "256", "--calls", "4"])
    kubelet = remote.consumer_kubelet
    assert kubelet is not None
    wait_for(
        lambda: phase(kube, ns, "matmul") in ("Succeeded", "Failed"),
        120,
        "the workload pod to finish",
        describe=remote.describe,
    )
    log = kubelet.container_log(pod["metadata"]["uid"], "main")
    assert phase(kube, ns, "matmul") == "Succeeded", log
    out = json.loads(log.strip().splitlines()[-1])
    # What the claim said while the pod ran (it is deallocated once the pod is done).
    ready = [c for c in seen.versions("matmul") if condition(c, "RemoteGPUReady")]
    assert ready, seen.versions("matmul")[-1:]
    data = (device_status(ready[-1]) or {})["data"]
    assert data["donor"] == remote.donor
    assert out["ok"] is True and out["where"] == "remote"
    assert out["lease"] == data["lease"] and out["calls"] == 4
    assert out["bytes"] == 4 * 3 * 256 * 256 * 4
    # The pod is done: its kubelet unprepared the claim; deleting it closes the lease.
    kube.delete(path(RESOURCE, "resourceclaims", "matmul", namespace=ns))
    kube.delete(path("v1", "pods", "matmul", namespace=ns))
    wait_for(lambda: remote.leases() == [], 60, "the lease to close", describe=remote.describe)


def container_state(kube: Kube, ns: str, name: str) -> JSON:
    pod = kube.get_or_none(path("v1", "pods", name, namespace=ns)) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    state: JSON = statuses[0].get("state") or {}
    return state


def test_the_donor_killed_mid_lease_fails_the_pod_with_a_typed_error(
    remote: RemoteSetup,
) -> None:
    kube, ns = remote.kube, remote.ns
    # The donor does not come back: the client gives up reconnecting after 3 s.
    args = ["--size", "64", "--calls", "1", "--seconds", "300", "--reconnect-within", "3"]
    pod = workload_pod(kube, ns, "steady", remote.consumer, args)
    wait_for(
        lambda: "running" in container_state(kube, ns, "steady") and remote.leases(),
        120,
        "the workload to run with its lease open",
        describe=remote.describe,
    )
    remote.donor_proc.kill()
    wait_for(
        lambda: phase(kube, ns, "steady") == "Failed",
        60,
        "the pod to fail once its donor is gone",
        describe=remote.describe,
    )
    assert container_state(kube, ns, "steady")["terminated"]["exitCode"] == 2
    assert remote.consumer_kubelet is not None
    log = remote.consumer_kubelet.container_log(pod["metadata"]["uid"], "main")
    out = json.loads(log.strip().splitlines()[-1])
    # A typed error of the service, or the connection refused before the handshake.
    assert out["ok"] is False and out["code"], out
    # The donor back: the claim's lease is gone there; ending pod and claim leaves nothing.
    remote.start_donor()
    kube.delete(path("v1", "pods", "steady", namespace=ns))
    kube.delete(path(RESOURCE, "resourceclaims", "steady", namespace=ns))
    wait_for(lambda: remote.leases() == [], 60, "no lease at the donor", describe=remote.describe)
    token_dir = remote.consumer_plugin.state_dir / "remote-gpu" if remote.consumer_plugin else None
    assert token_dir is not None
    wait_for(
        lambda: not list(token_dir.rglob("token")),
        60,
        "the consumer's token file to go",
        describe=remote.describe,
    )
