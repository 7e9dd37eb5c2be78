"""What ``composable-dra uninstall-drain`` decides, pure: which claims still hold our
driver's GPUs (the uninstall is refused while any does), the message that says so, and
the order in which the suite's objects are handed back (docs/operations.md, Uninstalling).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GROUP_VERSION = "composable.dra.io/v1alpha1"
# Deleted in this order, each kind gone before the next: a ComposabilityRequest would have
# its ComposableResources made again, and a ComposableResource's detach needs its Fabric.
DRAIN_ORDER = ("composabilityrequests", "composableresources", "fabrics")


@dataclass(frozen=True)
class Holder:
    """A claim allocated a device of our driver, and the pods it is reserved for."""

    namespace: str
    name: str
    pods: tuple[str, ...]

    def __str__(self) -> str:
        who = ", ".join(self.pods) if self.pods else "no pod yet: being allocated"
        return f"{self.namespace}/{self.name} ({who})"


def _results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [r for r in results if isinstance(r, Mapping)]


def holders(claims: Iterable[Mapping[str, Any]], driver: str) -> list[Holder]:
    """The claims with a device of ``driver`` allocated, sorted. The resource claim
    controller deallocates a claim when its last pod is gone, so an allocated claim is one
    a pod holds or one being scheduled (a pool GPU in its binding wait)."""
    found = []
    for claim in claims:
        if not any(r.get("driver") == driver for r in _results(claim)):
            continue
        meta = claim.get("metadata") or {}
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        pods = tuple(
            f"{r.get('resource', 'pod')} {r.get('name', '?')}"
            for r in reserved
            if isinstance(r, Mapping)
        )
        found.append(Holder(str(meta.get("namespace", "")), str(meta.get("name", "")), pods))
    return sorted(found, key=lambda h: (h.namespace, h.name))


def refusal(held: list[Holder], driver: str) -> str:
    """The one message a refused uninstall prints (helm shows the hook's log)."""
    shown = "; ".join(str(h) for h in held[:10])
    more = f"; and {len(held) - 10} more" if len(held) > 10 else ""
    return (
        f"refusing to uninstall: {len(held)} ResourceClaim(s) hold GPUs of {driver}: "
        f"{shown}{more}. Delete those pods (and their claims), then run helm uninstall "
        "again; nothing was removed."
    )


def to_delete(objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """The names of the objects not yet being deleted."""
    return sorted(
        str(o["metadata"]["name"])
        for o in objects
        if not (o.get("metadata") or {}).get("deletionTimestamp")
    )
