"""The claims as the phases read them, each read once per version of it.

A pass at 1,000 nodes reads 9,000 claims (a placeholder or a workload on every local GPU)
and three phases look at each: which results are our driver's, which wait on
FabricDeviceReady, which local device each one holds. The scaler keeps those facts
between passes by object (``view.Memo``), so a pass reads again only the claims that
changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from api.v1alpha1 import ClaimRef
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import parse_time
from composable_dra.model import names
from device_scaler.decide.reading import (
    allocation_node,
    is_true,
    meta_of,
    our_results,
    status_entry,
)


@dataclass(frozen=True)
class PendingClaim:
    """A claim with pool devices of ours waiting on FabricDeviceReady."""

    claim: JSON
    ref: ClaimRef
    node: str | None  # the allocation's node
    deleting: bool
    allocated_at: float | None
    results: list[JSON]  # our allocation results that wait on FabricDeviceReady


def pending_claim(claim: JSON, driver: str) -> PendingClaim | None:
    return _pending(claim, our_results(claim, driver))


def _pending(claim: JSON, results: Iterable[JSON]) -> PendingClaim | None:
    meta = meta_of(claim)
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    # Fabric pool devices only: a remote-lease device (RemoteGPUReady) is a donor's.
    ours = [r for r in results if names.FABRIC_DEVICE_READY in (r.get("bindingConditions") or [])]
    if not ours:
        return None
    return PendingClaim(
        claim,
        ClaimRef(meta.get("namespace", ""), meta["name"], meta.get("uid", "")),
        allocation_node(allocation),
        bool(meta.get("deletionTimestamp")),
        parse_time(allocation.get("allocationTimestamp")),
        ours,
    )


@dataclass(frozen=True)
class ClaimFacts:
    """One claim allocated devices of our driver, as the phases read it."""

    claim: JSON
    uid: str
    results: tuple[JSON, ...]  # the allocation's results of our driver
    pending: PendingClaim | None  # None too once every device says FabricDeviceReady


def _said_ready(claim: JSON, driver: str, result: JSON) -> bool:
    """The claim's status says the result's device is FabricDeviceReady."""
    entry = status_entry(claim, driver, str(result.get("pool")), str(result.get("device")))
    return is_true((entry or {}).get("conditions") or [], names.FABRIC_DEVICE_READY)


def claim_facts(claim: JSON, driver: str) -> ClaimFacts | None:
    """None for a claim with no device of ``driver``: no phase reads it."""
    results = tuple(our_results(claim, driver))
    if not results:
        return None
    uid = str(meta_of(claim).get("uid") or "")
    pending = _pending(claim, results)
    if pending is not None and all(_said_ready(claim, driver, r) for r in pending.results):
        pending = None  # attached and said so: phase 1 has nothing more to do for it
    return ClaimFacts(claim, uid, results, pending)
