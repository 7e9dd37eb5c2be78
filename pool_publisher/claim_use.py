"""What a pass of the publisher reads of each claim: the devices its allocation holds, or
whether it waits for one, and of which DeviceClasses.

A pass runs on every claim event, and in a burst of 1,000 claims on a cluster of 1,000
nodes there are 9,000 claims (the nodes' own GPUs' too): reading each one again on each
pass was a fifth of the publisher's CPU. The publisher keeps each claim's use while the
claims informer keeps the same object (a ``Derived`` of ``claim_use``), so a pass reads
again only the claims that changed since the last.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from composable_dra.k8s.kept import request_classes
from composable_dra.k8s.kube import JSON


@dataclass(frozen=True)
class ClaimUse:
    """``results``: (driver, pool, device) of each device the claim's allocation holds;
    ``waiting``: no allocation and not being deleted, asking for ``classes``."""

    results: tuple[tuple[str, str, str], ...] = ()
    waiting: bool = False
    classes: tuple[str, ...] = ()


_NONE = ClaimUse()


def claim_use(claim: JSON) -> ClaimUse:
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation:
        results = (allocation.get("devices") or {}).get("results") or []
        return ClaimUse(
            tuple(
                (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
                for r in results
            )
        )
    if (claim.get("metadata") or {}).get("deletionTimestamp"):
        return _NONE
    return ClaimUse(waiting=True, classes=tuple(request_classes(claim)))


def held(uses: Iterable[ClaimUse], drivers: Collection[str]) -> set[tuple[str, str]]:
    """(pool, device) of every allocation result of one of ``drivers``."""
    return {(pool, dev) for u in uses for driver, pool, dev in u.results if driver in drivers}


def waiting(
    claims: Sequence[JSON], uses: Sequence[ClaimUse], classes: Collection[str] | None = None
) -> list[JSON]:
    """The claims (``uses[i]`` is ``claims[i]``'s) that wait for one of ``classes`` (None:
    for anything)."""
    return [
        claim
        for claim, use in zip(claims, uses, strict=True)
        if use.waiting and (classes is None or any(c in classes for c in use.classes))
    ]
