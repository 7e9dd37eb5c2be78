"""How many free devices a pool offers at once: the window, sized to pending demand.

The scheduler evaluates every free pool device a node sees against the claim's `local`
alternative on every node it filters, for every pod (docs/attach-flow.md, The scheduler's
pace), so fewer free devices on show make each pod cheaper to schedule. Too few, and pods
scheduled before the publisher's next pass find the pool empty and wait in the
scheduler's backoff: the fixed window's slowdown at 100 claims in one zone. So the window
follows the claims not yet allocated: their share of each pool plus a margin, never under
``MIN_WINDOW``, and it does not shrink while any claim is pending (a device the scheduler
is about to pick stays on show).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from composable_dra.k8s.kept import request_classes
from composable_dra.k8s.kube import JSON

# Measured at 1,000 nodes (docs/attach-flow.md, The scheduler's pace): each free device on
# show costs every pod one CEL evaluation per node filtered; 8 kept pool claims within 1.2x
# of local ones' scheduler CPU, 32 did not (1.65x).
MIN_WINDOW = 8  # free devices a pool offers with no claim pending
MARGIN = 8  # over the pending claims' share: what the scheduler takes between passes
AUTO = -1  # --max-free-devices-per-pool's default: the window sizes itself


@dataclass(frozen=True)
class WindowPolicy:
    """``fixed`` > 0: that many free devices a pool; 0: every free device; AUTO: sized to
    the pending claims (``window_size``)."""

    fixed: int = AUTO
    minimum: int = MIN_WINDOW
    margin: int = MARGIN

    @property
    def auto(self) -> bool:
        return self.fixed < 0


def waiting_claims(claims: Iterable[JSON], classes: Collection[str] | None = None) -> list[JSON]:
    """Claims without an allocation, not being deleted, that ask for one of ``classes``
    (the DeviceClasses that select a pool's driver; None: any claim)."""
    return [
        c
        for c in claims
        if not (c.get("status") or {}).get("allocation")
        and not (c.get("metadata") or {}).get("deletionTimestamp")
        and (classes is None or any(name in classes for name in request_classes(c)))
    ]


def pending_claims(claims: Iterable[JSON], classes: Collection[str] | None = None) -> int:
    """How many claims wait (``waiting_claims``). Another driver's waiting claims are no
    demand on the pool: counting them grew the window for nothing."""
    return len(waiting_claims(claims, classes))


def window_size(pending: int, pools: int, last: int, policy: WindowPolicy) -> int:
    """Free devices per pool for this pass (0: every free device).

    The pending claims may go to any pool: each pool gets their even share plus the
    margin. ``last``: the previous pass's size, kept while claims are pending.
    """
    if not policy.auto:
        return policy.fixed
    share = -(-pending // max(1, pools))  # ceiling division
    target = max(policy.minimum, share + policy.margin) if pending else policy.minimum
    return max(target, last) if pending else target
