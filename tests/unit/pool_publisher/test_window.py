"""The pool window's size: the pending claims' share of each pool plus a margin."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pool_publisher import publish
from pool_publisher.main import window_arg
from pool_publisher.window import (
    AUTO,
    MARGIN,
    MIN_WINDOW,
    WindowPolicy,
    pending_claims,
    window_size,
)

AUTO_POLICY = WindowPolicy()


def claim(allocated: bool = False, deleting: bool = False) -> dict[str, object]:
    meta: dict[str, object] = {"name": "c"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, object] = {"allocation": {"devices": {"results": []}}} if allocated else {}
    return {"metadata": meta, "status": status}


def test_pending_claims_are_the_unallocated_ones_not_being_deleted() -> None:
    claims = [claim(), claim(), claim(allocated=True), claim(deleting=True)]
    assert pending_claims(claims) == 2


def test_with_nothing_pending_a_pool_offers_the_minimum() -> None:
    assert window_size(0, 16, 0, AUTO_POLICY) == MIN_WINDOW
    # A burst over: back to the minimum.
    assert window_size(0, 16, 200, AUTO_POLICY) == MIN_WINDOW


def test_the_window_covers_each_pools_share_of_the_pending_claims_and_a_margin() -> None:
    # 100 claims, one pool: every one fits at once (the fixed window's slowdown).
    assert window_size(100, 1, 0, AUTO_POLICY) == 100 + MARGIN
    # 1,000 claims over 16 pools: 63 each, and the margin.
    assert window_size(1000, 16, 0, AUTO_POLICY) == 63 + MARGIN
    assert window_size(10, 16, 0, AUTO_POLICY) == max(MIN_WINDOW, 1 + MARGIN)


def test_the_window_does_not_shrink_while_claims_are_pending() -> None:
    # A device the scheduler may be picking stays on show.
    assert window_size(20, 1, 116, AUTO_POLICY) == 116


def test_a_fixed_window_or_none_is_kept_as_given() -> None:
    assert window_size(1000, 1, 0, WindowPolicy(8)) == 8
    assert window_size(1000, 1, 0, WindowPolicy(0)) == 0


@given(pending=st.integers(0, 5000), pools=st.integers(0, 64), last=st.integers(0, 5000))
def test_an_auto_window_always_holds_each_pools_share(pending: int, pools: int, last: int) -> None:
    size = window_size(pending, pools, last, AUTO_POLICY)
    assert size >= MIN_WINDOW
    assert size * max(1, pools) >= pending
    if pending:
        assert size >= last


def test_the_flag_takes_auto_zero_or_a_count() -> None:
    assert window_arg("auto") == AUTO
    assert window_arg("0") == 0
    assert window_arg("32") == 32
    with pytest.raises(argparse.ArgumentTypeError):
        window_arg("-2")
    with pytest.raises(ValueError):
        window_arg("many")


def test_the_publisher_sizes_its_window_over_the_pools_of_its_last_plan() -> None:
    pub = publish.PoolPublisher(None, None)  # type: ignore[arg-type]  # not started
    assert pub._window([]) == MIN_WINDOW
    # Before its first plan it knows no pool: every pending claim may go to one.
    assert pub._window([claim()] * 40) == 40 + MARGIN
    assert pub._window([]) == MIN_WINDOW
    pub._generations = {f"fab/zone-{i}": 1 for i in range(4)}
    assert pub._window([claim()] * 40) == 10 + MARGIN
    assert publish.POOL_WINDOW._value.get() == 10 + MARGIN
    assert publish.PoolPublisher(None, None, max_free=0)._window([claim()]) == 0  # type: ignore[arg-type]
