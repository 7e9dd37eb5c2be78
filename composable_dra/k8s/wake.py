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

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import Counter

from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import parse_time

# kube-scheduler's binding-condition check (PreBind, every 5 s after an immediate first
# one); the touch waits that long plus a margin for its informer and its poll goroutine.
RECHECK_SECONDS = 5.0
WAKE_AFTER = RECHECK_SECONDS + 2.0

TOUCH_EVENT = "pool touched to wake pods"  # what a writer logs on each touch
SLICE_WAKES = Counter(
    "composable_dra_slice_wakes_total",
    "Slice writes made only to wake pods that a dropped in-flight allocation left waiting",
)

Held = tuple[str, str, str]  # (claim uid, pool, device)
Mine = Callable[[str, str], bool]  # (driver, pool): a pool this writer writes


def _obj(value: object) -> JSON:
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> list[JSON]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _statuses(claim: JSON) -> Mapping[tuple[str, str, str], list[JSON]]:
    out: dict[tuple[str, str, str], list[JSON]] = {}
    for st in _dicts(_obj(claim.get("status")).get("devices")):
        key = (str(st.get("driver", "")), str(st.get("pool", "")), str(st.get("device", "")))
        out[key] = _dicts(st.get("conditions"))
    return out


def _results(claim: JSON, mine: Mine) -> list[tuple[Held, JSON]]:
    uid = str(_obj(claim.get("metadata")).get("uid", ""))
    allocation = _obj(_obj(claim.get("status")).get("allocation"))
    return [
        ((uid, str(r.get("pool", "")), str(r.get("device", ""))), r)
        for r in _dicts(_obj(allocation.get("devices")).get("results"))
        if mine(str(r.get("driver", "")), str(r.get("pool", "")))
    ]


def _names(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def allocated(claim: JSON, mine: Mine) -> frozenset[Held]:
    """The claim's allocation results in pools this writer writes."""
    return frozenset(held for held, _ in _results(claim, mine))


def met_since(result: JSON, conditions: list[JSON]) -> tuple[bool, float | None]:
    """(whether the scheduler may hold ``result`` in flight, since when its binding
    conditions are all True: None while they are not). Only a result with binding
    conditions is held, and not one with a failure condition True: the scheduler
    deallocates a failed binding itself, a write that wakes the waiting pods."""
    required = _names(result.get("bindingConditions"))
    if not required:
        return False, None
    by_type = {str(c.get("type")): c for c in conditions}
    failures = _names(result.get("bindingFailureConditions"))
    if any(_obj(by_type.get(f)).get("status") == "True" for f in failures):
        return False, None
    met = [_obj(by_type.get(t)) for t in required]
    if not all(c.get("status") == "True" for c in met):
        return True, None
    times = [parse_time(str(c.get("lastTransitionTime") or "")) for c in met]
    return True, max((t for t in times if t is not None), default=0.0)


def holds(claim: JSON, mine: Mine) -> dict[Held, float | None]:
    """The claim's results the scheduler may hold in flight, and since when their binding
    conditions are met (None: not yet)."""
    statuses = _statuses(claim)
    out: dict[Held, float | None] = {}
    for held, r in _results(claim, mine):
        may, since = met_since(r, statuses.get((str(r.get("driver")), held[1], held[2]), []))
        if may:
            out[held] = since
    return out


def dropped(
    before: Mapping[Held, float | None], still: frozenset[Held], now: float
) -> frozenset[str]:
    """Pools of the results that are no longer allocated at wall-clock time ``now`` and
    that the scheduler may have held in flight then: their binding conditions not met, or
    met too recently for its check to have seen them (lastTransitionTime has whole
    seconds: one more second of doubt)."""
    return frozenset(
        pool
        for (uid, pool, device), since in before.items()
        if (uid, pool, device) not in still and (since is None or now - since < RECHECK_SECONDS + 1)
    )


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


class Waker:
    """One slice writer's wake-ups: fed each claim event (an informer's ``on_event``),
    it plans a touch of a pool whose held allocation ended; the writer's loop asks
    ``next_in``, reports its own writes (``written``) and touches what ``take`` gives."""

    def __init__(self, mine: Mine) -> None:
        self.mine = mine
        self.schedule = WakeSchedule()
        self._held: dict[str, dict[Held, float | None]] = {}  # claim uid -> its held results
        self._lock = threading.Lock()

    def event(
        self, kind: str, claim: JSON, wall: float | None = None, mono: float | None = None
    ) -> frozenset[str]:
        """A claim added, modified or deleted; the pools whose touch this (re)planned."""
        wall = time.time() if wall is None else wall
        mono = time.monotonic() if mono is None else mono
        uid = str(_obj(claim.get("metadata")).get("uid", ""))
        gone = kind == "DELETED"
        now_held = {} if gone else holds(claim, self.mine)
        with self._lock:
            before = self._held.pop(uid, {})
            if now_held:
                self._held[uid] = now_held
            ended = dropped(before, frozenset() if gone else allocated(claim, self.mine), wall)
            return ended if self.schedule.add(ended, mono + WAKE_AFTER) else frozenset()

    def written(self, pools: Iterable[str], at: float | None = None) -> None:
        with self._lock:
            self.schedule.written(pools, time.monotonic() if at is None else at)

    def take(self, now: float | None = None) -> list[str]:
        with self._lock:
            return self.schedule.take(time.monotonic() if now is None else now)

    def next_in(self, now: float | None = None) -> float | None:
        with self._lock:
            return self.schedule.next_in(time.monotonic() if now is None else now)
