"""Issue 18 on the real control plane: each claim's own QoS profile as its device selector.

The Lab of tests/e2e/test_lend_policy.py (a donor node whose plugin lends 3 GPUs and reads
its donor's status, the donor process, the scaler's lease controller, a consumer node,
real DRA gRPC and the real kube-scheduler), its donor's plugin with a host profile
(``--host-slowdown-at-full``): from its donor's status it publishes ``linkLoad`` on its
remote devices and ``hostSlowdown``/``hostHeadroom`` on all of them. The load is real (a
matmul loop through the data plane); the scheduler evaluates the CEL that
``qos.cel_selector`` wrote (deploy/examples/remote-qos.yaml and a light profile's).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.lending import netaware, qos
from testbed import ControlPlane, examples
from testbed.lending import Lab
from testbed.remote_pods import DRIVER, REMOTE
from testbed.wait import wait_for
from tests.e2e.conftest import SeeClaims
from tests.e2e.test_lend_policy import (
    RESOURCE,
    apply_example,
    end,
    on_node,
    pool_slices,
    remote_claim,
    running_lab,
    wait_phase,
    workload,
)

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("device_class")]
EXAMPLE = "remote-qos"
# The example's profile (its comment's command) and a job the link barely slows.
NETWORK_BOUND = qos.QosProfile(transfer=0.5, tolerance=0.1, host_load=0.0)
LIGHT = qos.QosProfile(transfer=0.001, tolerance=1.0, host_load=0.0)


@pytest.fixture
def lab(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, namespace: str
) -> Iterator[Lab]:
    # The host carries twice the link: the lease traffic alone loads it up to one half.
    qos_flags = ("--host-slowdown-at-full=0.2", "--host-bandwidth=4000000")
    with running_lab(kube_json, control_plane, short_tmp, namespace, *qos_flags) as lab:
        yield lab


def loads(kube: Kube, donor: str) -> dict[str, qos.DeviceLoad]:
    """What each device of the donor's pool publishes, read back as `qos.DeviceLoad`
    (devices that publish none left out)."""
    out = {}
    for s in pool_slices(kube, donor):
        for d in s["spec"].get("devices") or []:
            a = {k: v.get("int") for k, v in (d.get("attributes") or {}).items()}
            if a.get(qos.HOST_SLOWDOWN) is None:
                continue
            link = a.get(qos.LINK_LOAD)
            out[d["name"]] = qos.DeviceLoad(
                host_slowdown=a[qos.HOST_SLOWDOWN] / qos.SCALE,
                link_load=None if link is None else link / qos.SCALE,
                headroom=a[qos.HEADROOM] / qos.SCALE,
            )
    return out


def remote_loads(kube: Kube, donor: str) -> dict[str, qos.DeviceLoad]:
    return {n: d for n, d in loads(kube, donor).items() if n.endswith("-remote")}


def remote_fit(kube: Kube, donor: str, profile: qos.QosProfile) -> bool:
    """Whether ``profile`` fits a remote device of the donor by what they publish."""
    return any(qos.fits(profile, d) for d in remote_loads(kube, donor).values())


def open_devices(kube: Kube, donor: str) -> list[str]:
    """The remote devices that offer host headroom (one GPU no one holds: `qos.closed`)."""
    return sorted(n for n, d in remote_loads(kube, donor).items() if d.headroom > 0)


def claim_name(kube: Kube, ns: str, pod: str) -> str | None:
    """The name of the claim generated for ``pod`` from its template (None before)."""
    p = kube.get(path("v1", "pods", pod, namespace=ns))
    statuses = (p.get("status") or {}).get("resourceClaimStatuses") or []
    return str(statuses[0]["resourceClaimName"]) if statuses else None


def unschedulable(kube: Kube, ns: str, pod: str) -> str | None:
    """The scheduler's message once it found no node for ``pod``."""
    p = kube.get(path("v1", "pods", pod, namespace=ns))
    for c in (p.get("status") or {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable":
            return str(c.get("message", ""))
    return None


def test_a_network_bound_claim_waits_for_a_busy_donor_while_a_light_one_is_served(
    lab: Lab, claims_seen: SeeClaims
) -> None:
    kube, ns = lab.kube, lab.namespace
    donor = lab.donors[0].node
    wait_for(
        lambda: remote_fit(kube, donor, NETWORK_BOUND) is True,
        60,
        "the donor's devices to publish a quiet host and link",
        describe=lab.describe,
    )
    published = loads(kube, donor)
    # Every device publishes the host's load; only the remote ones the link's.
    assert {n.endswith("-remote") for n in published} == {True, False}
    assert all((d.link_load is None) != n.endswith("-remote") for n, d in published.items())
    # One GPU carries the headroom; the others publish it taken, so that the scheduler
    # does not hand it to several claims before the next publication.
    assert len(open_devices(kube, donor)) == 1, published
    # Real load: a workload that keeps multiplying 256x256 matrices on the donor.
    workload(lab, "loader", ["--size", "256", "--calls", "1", "--seconds", "600"])
    wait_for(
        lambda: remote_fit(kube, donor, NETWORK_BOUND) is False,
        90,
        "a link load on the busy donor's remote devices that the network-bound job cannot bear",
        describe=lab.describe,
    )
    high = min(d.link_load or 0.0 for n, d in loads(kube, donor).items() if n.endswith("-remote"))
    assert high >= 0.25, loads(kube, donor)
    # Both profiles tolerate the link-busy taint: their selectors decide, not the taint.
    seen = claims_seen(kube, ns)
    apply_example(kube, ns, on_node(lab.consumers[0].node), EXAMPLE)
    [bound] = examples.pods(EXAMPLE)
    light = remote_claim(
        "light",
        selectors=[{"cel": {"expression": e}} for e in (REMOTE, qos.cel_selector(LIGHT, DRIVER))],
        tolerations=[netaware.INSENSITIVE_TOLERATION],
    )
    workload(lab, "light", ["--size", "64", "--calls", "2"], light)
    assert wait_phase(lab, "light", ("Succeeded", "Failed")) == "Succeeded"
    message = wait_for(
        lambda: unschedulable(kube, ns, bound),
        60,
        f"pod {bound} to be found unschedulable",
        describe=lab.describe,
    )
    assert "CEL" not in message and "error" not in message.lower(), message
    name = claim_name(kube, ns, bound)
    assert name is not None and seen.allocated(name) is None, seen.versions(name or "")
    assert remote_fit(kube, donor, NETWORK_BOUND) is False
    assert wait_phase(lab, "loader", ("Running",)) == "Running"
    # The load stops: the published load falls and the network-bound claim is served.
    end(lab, "loader")
    wait_for(
        lambda: remote_fit(kube, donor, NETWORK_BOUND) is True,
        60,
        "the published load to fall once the link is quiet",
        describe=lab.describe,
    )
    ended = seen.wait_pod_ended(bound, 120, describe=lab.describe)
    assert ended["status"]["phase"] == "Succeeded"
    claim = seen.wait_allocated(name, "the network-bound claim's allocation")
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["pool"] == donor and result["device"].endswith("-remote"), result


# A claim that declares a profile (its config's ``qos``) and holds a GPU of the donor; one
# that would add more host load than the first can bear.
HELD = qos.QosProfile(transfer=0.5, tolerance=0.1, host_load=0.05)
HEAVY = qos.QosProfile(transfer=0.001, tolerance=1.0, host_load=0.8)


def declared(profile: qos.QosProfile) -> JSON:
    """A claim's config that declares ``profile`` (GpuConfig ``qos``)."""
    parameters = {
        "apiVersion": "gpu.composable.dra.io/v1alpha1",
        "kind": "GpuConfig",
        "qos": {
            "transfer": profile.transfer,
            "tolerance": profile.tolerance,
            "hostLoad": profile.host_load,
        },
    }
    return {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}


def test_a_held_claims_declared_profile_keeps_its_headroom(lab: Lab) -> None:
    kube, ns = lab.kube, lab.namespace
    donor = lab.donors[0].node
    wait_for(
        lambda: [d.headroom for d in remote_loads(kube, donor).values()].count(1.0) == 1,
        60,
        "one device of a quiet donor to offer all the host's headroom",
        describe=lab.describe,
    )
    holder = remote_claim("holder", tolerations=[netaware.INSENSITIVE_TOLERATION])
    holder["spec"]["devices"]["config"] = [declared(HELD)]
    workload(lab, "holder", ["--size", "64", "--calls", "1", "--seconds", "600"], holder)
    assert wait_phase(lab, "holder", ("Running",)) == "Running"
    # The donor reads the profile from the claim when it opens the lease; its node's
    # plugin keeps the host load the holder can bear: 0.1 x 1.5 / 0.2 = 0.75 at most.
    budget = HELD.budget(True) / 0.2
    wait_for(
        lambda: 0 < max(d.headroom for d in remote_loads(kube, donor).values()) <= budget,
        60,
        f"the open device's headroom to fall to what the holder bears (<= {budget})",
        describe=lab.describe,
    )
    held = kube.get(path(RESOURCE, "resourceclaims", "holder", namespace=ns))
    [result] = held["status"]["allocation"]["devices"]["results"]
    assert result["device"] not in open_devices(kube, donor), (result, loads(kube, donor))
    # A claim that would add more host load than that is offered none of the host's devices.
    selectors = [{"cel": {"expression": e}} for e in (REMOTE, qos.cel_selector(HEAVY, DRIVER))]
    heavy = remote_claim("heavy", selectors=selectors)
    workload(lab, "heavy", ["--size", "64", "--calls", "2"], heavy)
    message = wait_for(
        lambda: unschedulable(kube, ns, "heavy"),
        60,
        "the heavy claim's pod to be found unschedulable",
        describe=lab.describe,
    )
    assert "CEL" not in message and "error" not in message.lower(), message
    assert not remote_fit(kube, donor, HEAVY)
    # The holder ends: its headroom is free again, and the heavy claim is served.
    end(lab, "holder")
    assert wait_phase(lab, "heavy", ("Succeeded", "Failed")) == "Succeeded"
