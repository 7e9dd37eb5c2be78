"""Issue 31 item 3: a donor restart no longer strands the pod that uses its GPU.

The pod's own process (started by consumer C's kubelet emulator with the claim's CDI
edits: its lease directory mounted) runs a loop of ``matmul`` calls on donor A. The donor
is killed mid-loop and started again (same node, same device, a new process that holds
no lease). The lease controller re-opens the lease for the same allocation, C's plugin
writes the new lease's token and endpoint into the claim's directory, and the client
reconnects on its own: the pod finishes without a restart, the same process before and
after, and the calls that failed are counted (none: ``matmul`` is declared idempotent,
so a call in flight during the outage is retried on the new connection).

Every component is its own process on the real control plane; the setup is
test_remote_lease's.
"""

from __future__ import annotations

import json

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from testbed.wait import wait_for
from tests.e2e.conftest import SeeClaims
from tests.e2e.test_remote_lease import RemoteSetup, condition, device_status, remote
from tests.e2e.test_remote_pod import container_state, phase, workload_pod

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("device_class")]
__all__ = ["remote"]  # the fixture this module uses
RESOURCE = "resource.k8s.io/v1"


def claim_lease(claim: JSON | None) -> tuple[int, str, str] | None:
    """The ready lease, the donor instance that opened it and the condition's reason."""
    ready = condition(claim, "RemoteGPUReady")
    if ready is None:
        return None
    data = (device_status(claim or {}) or {}).get("data") or {}
    return int(data["lease"]), str(data["instance"]), str(ready["reason"])


def connected(remote: RemoteSetup) -> bool:
    """The donor's data plane took a connection for a lease (the workload's HELLO)."""
    return any(e.get("event") == "lease opened" for e in remote.donor_proc.log_events(True))


def restart_count(kube: Kube, ns: str, name: str) -> int:
    pod = kube.get(path("v1", "pods", name, namespace=ns))
    statuses: list[JSON] = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", -1))


def test_a_donor_restart_does_not_strand_the_pod(
    remote: RemoteSetup, claims_seen: SeeClaims
) -> None:
    kube, ns = remote.kube, remote.ns
    seen = claims_seen(kube, ns)
    # Long enough that the donor goes down and comes back inside the loop.
    args = ["--size", "64", "--calls", "1", "--seconds", "30"]
    pod = workload_pod(kube, ns, "loop", remote.consumer, args)
    wait_for(
        lambda: "running" in container_state(kube, ns, "loop") and connected(remote),
        120,
        "the workload to run, connected to its lease",
        describe=remote.describe,
    )
    remote.donor_proc.kill()
    remote.start_donor()
    wait_for(
        lambda: phase(kube, ns, "loop") in ("Succeeded", "Failed"),
        120,
        "the workload pod to finish",
        describe=remote.describe,
    )
    assert remote.consumer_kubelet is not None
    log = remote.consumer_kubelet.container_log(pod["metadata"]["uid"], "main")
    # Not stranded: the pod finished its loop, its container never restarted.
    assert phase(kube, ns, "loop") == "Succeeded", log
    assert restart_count(kube, ns, "loop") == 0
    lines = [json.loads(line) for line in log.strip().splitlines() if line.startswith("{")]
    start, out = lines[0], lines[-1]
    # One process from the first call to the last: it printed its PID before and after.
    assert start["event"] == "started" and out["pid"] == start["pid"], lines
    assert out["ok"] is True and out["reconnects"] >= 1, out
    # matmul is idempotent: the calls the outage interrupted were retried, none failed.
    assert out["failed_calls"] == 0, out
    print(f"failed calls: {out['failed_calls']}, reconnects: {out['reconnects']}")
    # The lease was re-opened for the same claim at the restarted donor (what the claim
    # said while the pod ran: it is deallocated once the pod is done), and the pod's
    # process ended on the re-opened lease.
    leases = [lease for c in seen.versions("loop") if (lease := claim_lease(c)) is not None]
    before, after = leases[0], leases[-1]
    assert before[2] == "LeaseOpen" and after[2] == "LeaseReopened", leases
    assert after[1] != before[1] and after[0] != before[0], leases
    assert out["lease"] == after[0], (out, after)
    kube.delete(path("v1", "pods", "loop", namespace=ns))
    kube.delete(path(RESOURCE, "resourceclaims", "loop", namespace=ns))
    wait_for(lambda: remote.leases() == [], 60, "the lease to close", describe=remote.describe)
