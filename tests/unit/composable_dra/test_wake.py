"""composable_dra/k8s/wake.py: which ended allocations the scheduler may have held in flight,
and when their pool is touched."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.k8s.kept import claim_binding_fields
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import format_time
from composable_dra.k8s.wake import WAKE_AFTER, Waker, WakeSchedule, holds
from tests.unit.fuzz_json import JSON_VALUES

DRIVER = "gpu.composable.dra.io"
POOL = "fab/zone-a"
NOW = 1_800_000_000.0  # wall clock
MONO = 1000.0


def mine(driver: str, pool: str) -> bool:
    return driver == DRIVER and pool == POOL


def claim(
    uid: str = "u1",
    ready: float | None = None,
    failed: bool = False,
    conditions: bool = True,
    pool: str = POOL,
) -> JSON:
    """A claim allocated device d1 of ``pool``, with FabricDeviceReady=True since ``ready``
    (None: not yet) or FabricDeviceFailed=True."""
    result: JSON = {"driver": DRIVER, "pool": pool, "device": "d1", "request": "gpu"}
    if conditions:
        result["bindingConditions"] = ["FabricDeviceReady"]
        result["bindingFailureConditions"] = ["FabricDeviceFailed"]
    status: JSON = {"allocation": {"devices": {"results": [result]}}}
    conds: list[JSON] = []
    if ready is not None:
        conds.append(
            {
                "type": "FabricDeviceReady",
                "status": "True",
                "lastTransitionTime": format_time(ready),
            }
        )
    if failed:
        conds.append({"type": "FabricDeviceFailed", "status": "True"})
    if conds:
        status["devices"] = [{"driver": DRIVER, "pool": pool, "device": "d1", "conditions": conds}]
    return {"metadata": {"name": "c", "namespace": "ns", "uid": uid}, "status": status}


def deallocated(uid: str = "u1") -> JSON:
    return {"metadata": {"name": "c", "namespace": "ns", "uid": uid}, "status": {}}


def seen_then(first: JSON, kind: str, then: JSON, wall: float = NOW) -> tuple[Waker, Any]:
    w = Waker(mine)
    w.event("ADDED", first, wall=NOW, mono=MONO)
    return w, w.event(kind, then, wall=wall, mono=MONO + 1)


def test_a_pending_allocation_deleted_plans_one_touch_after_the_schedulers_check() -> None:
    w, planned = seen_then(claim(), "DELETED", claim())
    assert planned == {POOL}
    assert w.next_in(MONO + 1) == WAKE_AFTER
    assert w.take(MONO + 1 + WAKE_AFTER - 0.1) == []
    assert w.take(MONO + 1 + WAKE_AFTER) == [POOL]
    assert w.next_in(MONO + 100) is None  # once


def test_a_pending_allocation_deallocated_plans_a_touch() -> None:
    _, planned = seen_then(claim(), "MODIFIED", deallocated())
    assert planned == {POOL}


def test_a_result_met_just_before_its_claim_went_may_still_be_held() -> None:
    _, planned = seen_then(claim(ready=NOW - 2), "DELETED", claim(ready=NOW - 2))
    assert planned == {POOL}


def test_a_result_met_long_before_its_claim_went_was_bound_and_needs_nothing() -> None:
    # Seen ready at once (so held then); its claim deleted minutes later.
    _, planned = seen_then(claim(ready=NOW), "DELETED", claim(ready=NOW), wall=NOW + 300)
    assert planned == set()


def test_a_failed_binding_is_deallocated_by_the_scheduler_and_needs_nothing() -> None:
    _, planned = seen_then(claim(failed=True), "MODIFIED", deallocated())
    assert planned == set()


def test_results_without_binding_conditions_or_of_other_pools_are_never_held() -> None:
    assert holds(claim(conditions=False), mine) == {}
    assert holds(claim(pool="node-1"), mine) == {}
    _, planned = seen_then(claim(pool="other/zone"), "DELETED", claim(pool="other/zone"))
    assert planned == set()


def test_a_pending_result_that_gets_ready_is_not_an_end() -> None:
    _, planned = seen_then(claim(), "MODIFIED", claim(ready=NOW))
    assert planned == set()


def test_the_kept_fields_tell_the_same() -> None:
    for c in (claim(), claim(ready=NOW - 1), claim(failed=True), claim(conditions=False)):
        assert holds(claim_binding_fields(c), mine) == holds(c, mine)


def test_a_rewrite_after_the_time_takes_the_touchs_place_one_before_does_not() -> None:
    s = WakeSchedule()
    s.add([POOL], 10.0)
    s.written([POOL], 9.0)  # before the scheduler's check: it did not wake anyone
    assert s.next_in(9.0) == 1.0
    s.written([POOL], 10.5)
    assert s.take(100.0) == []


def test_two_drops_make_one_touch_after_the_later() -> None:
    s = WakeSchedule()
    assert s.add(["a"], 10.0)
    assert s.add(["a"], 12.0)
    assert not s.add(["a"], 11.0)
    assert s.take(11.0) == []
    assert s.take(12.0) == ["a"]


_claims = st.one_of(
    st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3),
    st.builds(
        lambda c, status: {**c, "status": status},
        st.sampled_from([claim(), claim(ready=NOW), claim(failed=True)]),
        JSON_VALUES,
    ),
)


@settings(max_examples=300, deadline=None)
@given(first=_claims, then=_claims, kind=st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
def test_fuzz_any_claim_shape_is_read_without_error(first: JSON, then: JSON, kind: str) -> None:
    w = Waker(mine)
    w.event("ADDED", first, wall=NOW, mono=MONO)
    planned = w.event(kind, then, wall=NOW, mono=MONO)
    assert planned <= {POOL}
