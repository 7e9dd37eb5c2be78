"""Several remote GPUs in one container, on the real control plane: the example
``deploy/examples/several-remote-gpus.yaml`` (a claim for four remote devices) on
consumer node C, with donor A lending its four GPUs.

The scheduler allocates four of A's remote devices to one claim; the lease controller
opens a lease for each (one per device at the donor) and writes their four
``RemoteGPUReady`` together; C's plugin collects the four tokens and the CDI spec gives
the container ``REMOTE_GPUS=0,1,2,3`` and ``REMOTE_GPU_<i>_*``. The pod's own process
(started by C's kubelet emulator with those CDI edits) opens every lease, spreads its
products over them and checks each. Setup: test_remote_lease's, with four GPUs.

And one claim holding a GPU of each of two donors (``testbed.lending.Lab``), both lending
the same device name, ``gpu-0-remote``: the plugin keys the claim's CDI devices and lease
directories by pool and device, so the container gets both leases.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from testbed import ControlPlane, examples
from testbed.lending import Lab
from testbed.remote_pods import remote_claim_and_pod
from testbed.wait import wait_for
from tests.e2e.conftest import SeeClaims
from tests.e2e.test_remote_lease import RemoteSetup
from tests.e2e.test_remote_pod import phase

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("device_class")]
EXAMPLE = "several-remote-gpus"
GPUS = 4
RESOURCE = "resource.k8s.io/v1"
# The pod's process: its remote-GPU variables as one JSON line, then matmul on every lease.
SEES_AND_COMPUTES = (
    "import json, os, sys; from remote_gpu.workloads import matmul; "
    "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('REMOTE_GPU')}),"
    " flush=True); "
    "sys.exit(matmul.main(['--all-leases', '--size', '64', '--calls', '4']))"
)


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
    pod = seen.wait_pod_ended(name, 180, describe=remote.describe)
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


@pytest.fixture
def two_donors(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, namespace: str
) -> Iterator[Lab]:
    """Two donors lending one GPU each, both named ``gpu-0``, and one consumer."""
    unique = namespace.removeprefix("t-")
    lab = Lab(
        kube_json,
        control_plane,
        short_tmp,
        namespace=namespace,
        prefix=f"pk{unique}-",
        domain=f"pk-{unique}",
    )
    try:
        lab.start(donors=2, gpus=1, max_leases=1, consumers=1)
        yield lab
    finally:
        lab.stop()


def test_one_claim_computes_on_same_named_gpus_of_two_donors(
    two_donors: Lab, claims_seen: SeeClaims
) -> None:
    lab = two_donors
    kube, ns, consumer = lab.kube, lab.namespace, lab.consumers[0]
    seen = claims_seen(kube, ns)
    claim, pod = remote_claim_and_pod(
        "two-donors", consumer.node, ["python", "-c", SEES_AND_COMPUTES], count=2
    )
    kube.create(path(RESOURCE, "resourceclaims", namespace=ns), claim)
    kube.create(path("v1", "pods", namespace=ns), pod)
    seen.wait_pod_ended("two-donors", 180, describe=lab.describe)
    uid = kube.get(path("v1", "pods", "two-donors", namespace=ns))["metadata"]["uid"]
    lines = consumer.kubelet.container_log(uid, "main").strip().splitlines()
    allocated = seen.wait_allocated("two-donors", "the claim's allocation seen")
    results = allocated["status"]["allocation"]["devices"]["results"]
    assert sorted((r["pool"], r["device"]) for r in results) == [
        (d.node, "gpu-0-remote") for d in lab.donors
    ]
    assert phase(kube, ns, "two-donors") == "Succeeded", lines[-5:]
    env, out = json.loads(lines[0]), json.loads(lines[-1])
    assert env["REMOTE_GPUS"] == "0,1", env
    endpoints = {env["REMOTE_GPU_0_ENDPOINT"], env["REMOTE_GPU_1_ENDPOINT"]}
    assert len(endpoints) == 2, env
    assert {env["REMOTE_GPU_0_LEASE"], env["REMOTE_GPU_1_LEASE"]} == set(map(str, out["leases"]))
    assert out["ok"] is True and out["where"] == "remote", out
    assert len(set(out["leases"])) == 2 and all(n >= 1 for n in out["calls_by_lease"].values())
    # Ending pod and claim closes both leases and leaves no token file.
    kube.delete(path("v1", "pods", "two-donors", namespace=ns))
    kube.delete(path(RESOURCE, "resourceclaims", "two-donors", namespace=ns))
    wait_for(lambda: lab.open_leases() == 0, 60, "both leases to close", describe=lab.describe)
    wait_for(lambda: lab.token_files() == 0, 60, "the token files to go", describe=lab.describe)
