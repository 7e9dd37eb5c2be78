"""How many free devices a pool offers at once: the window, sized to pending demand.

The scheduler evaluates every free pool device a node sees against the claim's `local`
alternative on every node it filters, for every pod (docs/attach-flow.md, The scheduler's
pace), so fewer free devices on show make each pod cheaper to schedule. Too few, and pods
scheduled before the publisher's next pass find the pool empty and wait in the
scheduler's backoff: the fixed window's slowdown at 100 claims in one zone. So the window
follows the claims not yet allocated: their share of each pool plus a margin, never under
``MIN_WINDOW``, and it does not shrink while any claim is pending (a device the scheduler
is about to pick stays on show).

In a large cluster that share is too dear: each free device on show costs every pod one
evaluation on each node the scheduler filters, and at 1,000 nodes a burst of 1,000 claims
(63 + 8 a pool) made the scheduler nearly all of the burst's time. So an automatic window
also stays within ``EVALUATION_BUDGET`` evaluations per pod over the nodes the scheduler
filters (``window_cap``); the publisher refills the pools as the scheduler takes from them
(each allocation rewrites its pool anyway), so pods spread over many pools do not find
them empty. A small cluster, where the share matters and costs little, keeps it whole.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from composable_dra.k8s.kube import JSON
from pool_publisher.claim_use import claim_use, waiting

# Measured at 1,000 nodes (docs/attach-flow.md, The scheduler's pace): each free device on
# show costs every pod one CEL evaluation per node filtered; 8 kept pool claims within 1.2x
# of local ones' scheduler CPU, 32 did not (1.65x).
MIN_WINDOW = 8  # free devices a pool offers with no claim pending
MARGIN = 8  # over the pending claims' share: what the scheduler takes between passes
AUTO = -1  # --max-free-devices-per-pool's default: the window sizes itself
# CEL evaluations of free pool devices one pod may cost over the nodes the scheduler filters:
# at 1,000 nodes (420 filtered) a window of 4, at 100 nodes 20; 4 nodes see 512.
EVALUATION_BUDGET = 2048
# kube-scheduler's numFeasibleNodesToFind (pkg/scheduler/schedule_one.go) with the default
# percentageOfNodesToScore: every node up to 100, then 50 - nodes/125 percent (at least 5).
MIN_FEASIBLE_NODES = 100
BASE_PERCENTAGE = 50
MIN_PERCENTAGE = 5


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
    claims = list(claims)
    return waiting(claims, [claim_use(c) for c in claims], classes)


def pending_claims(claims: Iterable[JSON], classes: Collection[str] | None = None) -> int:
    """How many claims wait (``waiting_claims``). Another driver's waiting claims are no
    demand on the pool: counting them grew the window for nothing."""
    return len(waiting_claims(claims, classes))


def nodes_filtered(nodes: int) -> int:
    """How many nodes kube-scheduler filters for a pod in a cluster of ``nodes`` (at least:
    it goes on past nodes that do not fit)."""
    if nodes <= MIN_FEASIBLE_NODES:
        return nodes
    percentage = max(MIN_PERCENTAGE, BASE_PERCENTAGE - nodes // 125)
    return max(MIN_FEASIBLE_NODES, nodes * percentage // 100)


def window_cap(nodes: int, budget: int = EVALUATION_BUDGET) -> int:
    """The largest automatic window in a cluster of ``nodes``: ``budget`` evaluations per pod
    over the nodes filtered, at least one device a pool."""
    return max(1, budget // max(1, nodes_filtered(nodes)))


def window_size(pending: int, pools: int, last: int, policy: WindowPolicy, *, nodes: int) -> int:
    """Free devices per pool for this pass (0: every free device).

    The pending claims may go to any pool: each pool gets their even share plus the
    margin, within the cluster's cap (``window_cap`` of its ``nodes``). ``last``: the
    previous pass's size, kept while claims are pending.
    """
    if not policy.auto:
        return policy.fixed
    share = -(-pending // max(1, pools))  # ceiling division
    target = max(policy.minimum, share + policy.margin) if pending else policy.minimum
    return min(window_cap(nodes), max(target, last) if pending else target)
