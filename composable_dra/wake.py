"""Waking the pods that a dropped in-flight allocation left waiting.

kube-scheduler v1.37.1 holds a pod's allocation "in flight" while the pod waits in PreBind
for its binding conditions, and lets it go only at its next check of them (a 5 s poll)
once the claim is gone or deallocated. No cluster event follows, so pods that failed
scheduling while the device was held wait for an unrelated event or the unschedulable
queue's flush (5 min). Any update of a ResourceSlice requeues them. So the one writer of
the device's pool (the pool publisher; a lending node's plugin) touches one slice of that
pool once, after the scheduler's check has passed (docs/attach-flow.md, Waking the pods a
cancelled allocation left waiting). The decisions are pure; ``WakeSchedule`` keeps the
times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import Counter

from composable_dra.kube import JSON
from composable_dra.timestamps import parse_time

# kube-scheduler's binding-condition check (PreBind, every 5 s after an immediate first
# one); the touch waits that long plus a margin for its informer and its poll goroutine.
RECHECK_SECONDS = 5.0
WAKE_AFTER = RECHECK_SECONDS + 1.5

SLICE_WAKES = Counter(
    "composable_dra_slice_wakes_total",
    "Slice writes made only to wake pods that a dropped in-flight allocation left waiting",
)

Held = tuple[str, str, str]  # (claim uid, pool, device)


def _statuses(claim: JSON) -> Mapping[tuple[str, str, str], list[JSON]]:
    out: dict[tuple[str, str, str], list[JSON]] = {}
    for st in (claim.get("status") or {}).get("devices") or []:
        key = (str(st.get("driver", "")), str(st.get("pool", "")), str(st.get("device", "")))
        out[key] = [c for c in st.get("conditions") or [] if isinstance(c, dict)]
    return out


def _results(claim: JSON) -> list[JSON]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        r for r in (allocation.get("devices") or {}).get("results") or [] if isinstance(r, dict)
    ]


def allocated(
    claims: Iterable[JSON], drivers: Collection[str], pools: Callable[[str], bool]
) -> frozenset[Held]:
    """(claim uid, pool, device) of every allocation result of ``drivers`` in ``pools``."""
    return frozenset(
        (str((c.get("metadata") or {}).get("uid", "")), str(r.get("pool", "")), str(r["device"]))
        for c in claims
        for r in _results(c)
        if r.get("driver") in drivers and "device" in r and pools(str(r.get("pool", "")))
    )


def waiting(result: JSON, conditions: list[JSON], now: float) -> bool:
    """Whether the scheduler may still hold ``result`` in flight: it has binding
    conditions, none of its failure conditions is True (a failed binding is deallocated by
    the scheduler itself, a write that wakes), and its binding conditions are not all True,
    or turned True too recently for the scheduler's check to have seen them."""
    required = [str(c) for c in result.get("bindingConditions") or []]
    if not required:
        return False
    by_type = {str(c.get("type")): c for c in conditions}
    failures = [str(c) for c in result.get("bindingFailureConditions") or []]
    if any((by_type.get(f) or {}).get("status") == "True" for f in failures):
        return False
    met = [by_type.get(t) for t in required]
    if not all(c is not None and c.get("status") == "True" for c in met):
        return True
    # lastTransitionTime has whole seconds: one more second of doubt.
    since = [parse_time(str(c.get("lastTransitionTime") or "")) for c in met if c is not None]
    return any(t is None or now - t < RECHECK_SECONDS + 1 for t in since)


def pending(
    claims: Iterable[JSON], drivers: Collection[str], pools: Callable[[str], bool], now: float
) -> frozenset[Held]:
    """The allocation results (of ``drivers``, in ``pools``) the scheduler may still hold in
    flight at wall-clock time ``now``."""
    out: set[Held] = set()
    for claim in claims:
        uid = str((claim.get("metadata") or {}).get("uid", ""))
        statuses = _statuses(claim)
        for r in _results(claim):
            driver, pool, device = str(r.get("driver")), str(r.get("pool", "")), r.get("device")
            if driver not in drivers or device is None or not pools(pool):
                continue
            if waiting(r, statuses.get((driver, pool, str(device)), []), now):
                out.add((uid, pool, str(device)))
    return frozenset(out)


def dropped(before: frozenset[Held], still: frozenset[Held]) -> frozenset[str]:
    """Pools of the results that were pending and are no longer allocated: the claim
    deleted or deallocated while the scheduler may have held it in flight."""
    return frozenset(pool for _, pool, _ in before - still)


@dataclass
class WakeSchedule:
    """Pools to touch once, each after its time (monotonic); a write of the pool at or
    after that time wakes the pods anyway and takes its place."""

    due: dict[str, float] = field(default_factory=dict)

    def add(self, pools: Iterable[str], at: float) -> bool:
        """Touch ``pools`` at ``at`` or later; a touch already planned moves to the later
        time (one write after both drops wakes for both). True if anything changed."""
        changed = False
        for pool in pools:
            if self.due.get(pool, 0.0) < at:
                self.due[pool] = at
                changed = True
        return changed

    def written(self, pools: Iterable[str], at: float) -> None:
        for pool in pools:
            if pool in self.due and self.due[pool] <= at:
                del self.due[pool]

    def take(self, now: float) -> list[str]:
        """The pools due at ``now``, no longer planned."""
        out = sorted(p for p, t in self.due.items() if t <= now)
        for pool in out:
            del self.due[pool]
        return out

    def next_in(self, now: float) -> float | None:
        """Seconds until the next touch is due; None when none is planned."""
        return max(0.0, min(self.due.values()) - now) if self.due else None


@dataclass
class Waker:
    """What one slice writer keeps: the results pending at its last look, the touches
    planned. ``observe`` on each look at the claims; ``schedule`` on each write."""

    pools: Callable[[str], bool]
    schedule: WakeSchedule = field(default_factory=WakeSchedule)
    _pending: frozenset[Held] = frozenset()

    def observe(
        self,
        claims: Collection[JSON],
        drivers: Collection[str],
        wall: float | None = None,
        mono: float | None = None,
    ) -> frozenset[str]:
        """Plan a touch for every pool whose pending allocation ended since the last look;
        the pools newly planned."""
        wall = time.time() if wall is None else wall
        mono = time.monotonic() if mono is None else mono
        ended = dropped(self._pending, allocated(claims, drivers, self.pools))
        self._pending = pending(claims, drivers, self.pools, wall)
        return frozenset(ended) if self.schedule.add(ended, mono + WAKE_AFTER) else frozenset()
