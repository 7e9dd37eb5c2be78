"""Issue 18 on the real control plane: the link-busy taint and SLO-aware lease counters.

The Lab (``testbed/lending.py``): a donor node whose plugin lends 3 GPUs and
reads its donor's status (``GET /v1/leases/status``), the ``remote-gpu-donor`` process
with its lease API, the scaler's lease controller and a consumer node, each its own
process, with real DRA gRPC and the real kube-scheduler. The load is real: a pod's
workload calls ``matmul`` on the donor in a loop, through the data plane, and the donor
measures the bytes its workers moved (its link is declared at 2 MB/s so that one
workload on this machine fills it); nothing injects a measurement.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.lending import netaware, remote_leases
from testbed import ControlPlane, examples
from testbed.lending import CONTROLLER_SA, Lab
from testbed.remote_pods import DEVICE_CLASS, DRIVER, REMOTE, matmul_claim_and_pod
from testbed.wait import wait_for
from tests.e2e.conftest import SeeClaims
from tests.e2e.test_lend import wait_unschedulable

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("device_class")]
RESOURCE = "resource.k8s.io/v1"
EXAMPLE = "remote-insensitive-slo"


@contextlib.contextmanager
def running_lab(
    kube: Kube, control_plane: ControlPlane, tmp: Path, namespace: str, *plugin_args: str
) -> Iterator[Lab]:
    """One donor (3 GPUs, its link declared at 2 MB/s) and one consumer; ``plugin_args``
    more flags for the donor's plugin."""
    unique = namespace.removeprefix("t-")
    lab = Lab(
        kube,
        control_plane,
        tmp,
        namespace=namespace,
        prefix=f"na{unique}-",
        domain=f"na-{unique}",
        donor_status_interval=0.25,
        donor_args=[
            "--link-bandwidth=2000000",  # bytes/s: one matmul loop fills it
            "--status-window=3",  # a loaded machine's pauses do not read as a quiet link
            "--allow=paced=remote_gpu.builtins:paced_matmul",
            "--latency-model=matmul=0.01",
            "--latency-model=paced=0.05",
        ],
        donor_plugin_args=["--link-busy-at=0.5", "--link-clear-at=0.2", *plugin_args],
    )
    try:
        lab.start(donors=1, gpus=3, max_leases=3, consumers=1)
        yield lab
    finally:
        lab.stop()


@pytest.fixture
def lab(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, namespace: str
) -> Iterator[Lab]:
    with running_lab(kube_json, control_plane, short_tmp, namespace) as lab:
        yield lab


def pool_slices(kube: Kube, donor: str) -> list[JSON]:
    items = kube.get(path(RESOURCE, "resourceslices"), fieldSelector=f"spec.driver={DRIVER}")
    return [s for s in items.get("items") or [] if s["spec"]["pool"]["name"] == donor]


def remote_taints(kube: Kube, donor: str) -> dict[str, list[str]]:
    """Each remote device of the donor's pool: the keys of its NoSchedule taints."""
    return {
        d["name"]: [t["key"] for t in d.get("taints") or [] if t.get("effect") == "NoSchedule"]
        for s in pool_slices(kube, donor)
        for d in s["spec"].get("devices") or []
        if d["name"].endswith("-remote")
    }


def tainted(kube: Kube, donor: str) -> bool | None:
    """True: every remote device carries the link-busy taint; False: none; None: mixed."""
    marks = {netaware.LINK_BUSY_TAINT in keys for keys in remote_taints(kube, donor).values()}
    return None if len(marks) != 1 else marks.pop()


def link_leases(kube: Kube, donor: str) -> str | None:
    for s in pool_slices(kube, donor):
        for counter_set in s["spec"].get("sharedCounters") or []:
            if counter_set["name"] == "link":
                return str(counter_set["counters"]["leases"]["value"])
    return None


def create_compact(kube: Kube, url_path: str, obj: JSON) -> JSON:
    """POST ``obj`` as compact JSON with sorted keys, as kubectl sends a manifest.

    The Python client's ``json.dumps`` puts spaces in a claim's opaque parameters and keeps
    the keys' order; the API server keeps those bytes as they came, but re-encodes them
    compactly, keys sorted, on any later patch of the claim's status, so the allocation
    that copied them no longer compares equal and the lease controller's status write is
    refused ("status.allocation: field cannot be modified once set")."""
    method, url, headers, _, _ = kube.api.param_serialize(
        "POST",
        url_path,
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        auth_settings=["BearerToken"],
    )
    body = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    resp = kube.api.rest_client.pool_manager.request(method, url, body=body, headers=headers)
    assert resp.status == 201, resp.data
    created: JSON = json.loads(resp.data)
    return created


def apply_example(kube: Kube, ns: str, pod: Callable[[JSON], JSON], example: str = EXAMPLE) -> None:
    """The example's objects in ``ns``, as ``kubectl create -f`` would send them."""
    plurals = {"ResourceClaimTemplate": "resourceclaimtemplates", "Pod": "pods"}
    for obj in examples.load(example):
        kind = obj["kind"]
        body = pod(obj) if kind == "Pod" else obj
        create_compact(kube, path(obj["apiVersion"], plurals[kind], namespace=ns), body)


def on_node(node: str) -> Callable[[JSON], JSON]:
    """A pod (an example's) pinned to ``node``."""

    def pinned(pod: JSON) -> JSON:
        return {**pod, "spec": {**pod["spec"], "nodeSelector": {"kubernetes.io/hostname": node}}}

    return pinned


def workload(lab: Lab, name: str, args: list[str], claim: JSON | None = None) -> None:
    """A claim (a plain remote request unless given) and a pod on the consumer whose
    process runs the matmul workload with ``args`` on the lease."""
    default, pod = matmul_claim_and_pod(name, lab.consumers[0].node, args, DEVICE_CLASS)
    kube, ns = lab.kube, lab.namespace
    create_compact(kube, path(RESOURCE, "resourceclaims", namespace=ns), claim or default)
    kube.create(path("v1", "pods", namespace=ns), pod)


def remote_claim(name: str, **request: Any) -> JSON:
    exactly = {"deviceClassName": DEVICE_CLASS, "selectors": [{"cel": {"expression": REMOTE}}]}
    return {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {**exactly, **request}}]}},
    }


def phase(kube: Kube, ns: str, name: str) -> str:
    pod = kube.get_or_none(path("v1", "pods", name, namespace=ns)) or {}
    return str((pod.get("status") or {}).get("phase", ""))


def wait_phase(lab: Lab, name: str, phases: tuple[str, ...], timeout: float = 120) -> str:
    kube, ns = lab.kube, lab.namespace

    def reached() -> str | None:
        now = phase(kube, ns, name)
        return now if now in phases else None

    found: str = wait_for(
        reached, timeout, f"pod {name} to be {' or '.join(phases)}", describe=lab.describe
    )
    return found


def end(lab: Lab, name: str) -> None:
    """Delete a workload's pod and claim (its lease closes)."""
    kube, ns = lab.kube, lab.namespace
    kube.delete(path("v1", "pods", name, namespace=ns))
    kube.delete(path(RESOURCE, "resourceclaims", name, namespace=ns))


def test_a_busy_donors_devices_are_tainted_and_only_insensitive_claims_get_one(
    lab: Lab, claims_seen: SeeClaims
) -> None:
    kube, ns = lab.kube, lab.namespace
    donor = lab.donors[0].node
    wait_for(lambda: tainted(kube, donor) is False, 60, "the donor's remote devices, untainted")
    # Real load: a workload that keeps multiplying 256x256 matrices on the donor.
    workload(lab, "loader", ["--size", "256", "--calls", "1", "--seconds", "600"])
    wait_for(
        lambda: tainted(kube, donor) is True,
        90,
        "the link-busy taint on the busy donor's remote devices",
        describe=lab.describe,
    )
    # Network-sensitive (the default): the scheduler leaves the busy donor's GPUs alone.
    workload(lab, "sensitive", ["--size", "64", "--calls", "2"])
    # Network-insensitive: the example's claim tolerates the taint and is served.
    seen = claims_seen(kube, ns)
    apply_example(kube, ns, on_node(lab.consumers[0].node))
    [insensitive] = examples.pods(EXAMPLE)
    pod = seen.wait_pod_ended(insensitive, 120, describe=lab.describe)
    assert pod["status"]["phase"] == "Succeeded"
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = seen.wait_allocated(claim_name, "the example claim's allocation")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == donor and result["device"].endswith("-remote"), result
    wait_unschedulable(kube, ns, "sensitive")
    assert tainted(kube, donor) is True and phase(kube, ns, "loader") == "Running"
    # The load falls (the loader ends): the taint goes and the sensitive claim is served.
    end(lab, "loader")
    wait_for(
        lambda: tainted(kube, donor) is False,
        60,
        "the taint to go once the link is quiet",
        describe=lab.describe,
    )
    assert wait_phase(lab, "sensitive", ("Succeeded", "Failed")) == "Succeeded"


def donor_status(lab: Lab) -> remote_leases.LendingStatus:
    d = lab.donors[0]
    client = remote_leases.LeaseClient(
        remote_leases.DonorDirectory({d.node: d.api_url}),
        remote_leases.TokenSource(lab.kube, lab.namespace, CONTROLLER_SA),
        str(lab.ca.cert_path),
    )
    return client.status(d.node)


def test_a_lease_that_would_break_an_admitted_slo_is_not_offered(lab: Lab) -> None:
    kube, ns = lab.kube, lab.namespace
    donor = lab.donors[0].node
    wait_for(lambda: link_leases(kube, donor) == "3", 60, "the link counter at the knee")
    # The first lease: every call of `paced` (50 ms alone) within 80 ms. Two leases would
    # take 100 ms a call by the donor's model (fitted from what it measures: one lease).
    config = {
        "requests": ["gpu"],
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": "gpu.composable.dra.io/v1alpha1",
                "kind": "GpuConfig",
                "latencySLO": {"function": "paced", "seconds": 0.08},
            },
        },
    }
    first = remote_claim("first")
    first["spec"]["devices"]["config"] = [config]
    args = ["--function", "paced", "--size", "16", "--calls", "1", "--seconds", "600"]
    workload(lab, "first", args, first)
    wait_phase(lab, "first", ("Running",))

    def measured() -> remote_leases.LendingStatus | None:
        s = donor_status(lab)
        paced = s.functions.get("paced")
        return s if paced is not None and paced.samples > 0 else None

    status = wait_for(measured, 60, "the donor to measure paced", describe=lab.describe)
    assert status.lease_capacity == 1 and status.leases == 1, status
    wait_for(lambda: link_leases(kube, donor) == "1", 30, "the link counter cut to 1")
    # A second lease (no SLO of its own) would break the first's: it is not offered.
    workload(lab, "second", ["--size", "64", "--calls", "2"])
    wait_unschedulable(kube, ns, "second")
    assert phase(kube, ns, "first") == "Running"
    # The first lease ends: the counter is back at the knee and the second is served.
    end(lab, "first")
    wait_for(lambda: link_leases(kube, donor) == "3", 60, "the link counter back at the knee")
    assert wait_phase(lab, "second", ("Succeeded", "Failed")) == "Succeeded"
