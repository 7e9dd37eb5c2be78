"""Several remote GPUs in one container, on the real control plane: the example
``deploy/examples/several-remote-gpus.yaml`` (a claim for four remote devices) on
consumer node C, with donor A lending its four GPUs.

The scheduler allocates four of A's remote devices to one claim; the lease controller
opens a lease for each (one per device at the donor) and writes their four
``RemoteGPUReady`` together; C's plugin collects the four tokens and the CDI spec gives
the container ``REMOTE_GPUS=0,1,2,3`` and ``REMOTE_GPU_<i>_*``. The pod's own process
(started by C's kubelet emulator with those CDI edits) opens every lease, spreads its
products over them and checks each. Setup: test_remote_lease's, with four GPUs.
"""

from __future__ import annotations

import json

import pytest

from composable_dra.k8s.kube import JSON, path
from testbed import examples
from testbed.wait import wait_for
from tests.e2e.conftest import SeeClaims
from tests.e2e.test_remote_lease import RemoteSetup
from tests.e2e.test_remote_pod import phase

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("device_class")]
EXAMPLE = "several-remote-gpus"
GPUS = 4


def test_a_container_computes_on_each_of_four_leased_gpus(
    donor_of_four: RemoteSetup, claims_seen: SeeClaims
) -> None:
    remote = donor_of_four
    kube, ns = remote.kube, remote.ns
    seen = claims_seen(kube, ns)

    def on_consumer(pod: JSON) -> JSON:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": remote.consumer}
        return pod

    examples.apply(kube, EXAMPLE, ns, on_consumer)
    [name] = examples.pods(EXAMPLE)
    wait_for(
        lambda: phase(kube, ns, name) in ("Succeeded", "Failed"),
        180,
        "the workload pod to finish",
        describe=remote.describe,
    )
    pod = kube.get(path("v1", "pods", name, namespace=ns))
    assert remote.consumer_kubelet is not None
    log = remote.consumer_kubelet.container_log(pod["metadata"]["uid"], "main")
    assert phase(kube, ns, name) == "Succeeded", log
    out = json.loads(log.strip().splitlines()[-1])
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = seen.wait_allocated(claim_name, "the claim's allocation seen")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == [f"gpu-{i}-remote" for i in range(GPUS)]
    assert {r["pool"] for r in results} == {remote.donor}
    # Each device's lease, as the controller wrote it while the pod ran, is one the
    # workload opened, in the allocation's order, and each computed.
    ready = [c for c in seen.versions(claim_name) if ready_leases(c, GPUS)]
    assert ready, seen.versions(claim_name)[-1:]
    leases = ready_leases(ready[-1], GPUS)
    by_device = [leases[r["device"]] for r in results]
    assert out["ok"] is True and out["where"] == "remote", out
    assert out["leases"] == by_device and len(set(by_device)) == GPUS
    assert sorted(out["calls_by_lease"]) == sorted(map(str, by_device))
    assert all(n >= 1 for n in out["calls_by_lease"].values()) and out["calls"] == 8
    assert out["bytes"] == 8 * 3 * 256 * 256 * 4


def ready_leases(claim: JSON, count: int) -> dict[str, int]:
    """device -> lease of the claim's ready remote devices, when all ``count`` are."""
    out = {}
    for st in (claim.get("status") or {}).get("devices") or []:
        ok = any(
            c["type"] == "RemoteGPUReady" and c["status"] == "True"
            for c in st.get("conditions") or []
        )
        if ok and st["device"].endswith("-remote"):
            out[st["device"]] = int(st["data"]["lease"])
    return out if len(out) == count else {}
