"""The pool window's size: the pending claims' share of each pool plus a margin."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composable_dra.k8s.kept import claim_binding_fields, request_classes
from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from pool_publisher import publish
from pool_publisher.claim_use import ClaimUse, claim_use
from pool_publisher.main import window_arg
from pool_publisher.window import (
    AUTO,
    EVALUATION_BUDGET,
    MARGIN,
    MIN_WINDOW,
    WindowPolicy,
    nodes_filtered,
    pending_claims,
    window_cap,
    window_size,
)

AUTO_POLICY = WindowPolicy()
SMALL = 4  # nodes: a cluster whose cap (window_cap) is above every window here


def claim(
    allocated: bool = False, deleting: bool = False, requests: list[JSON] | None = None
) -> JSON:
    meta: dict[str, object] = {"name": "c"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, object] = {"allocation": {"devices": {"results": []}}} if allocated else {}
    return {"metadata": meta, "spec": {"devices": {"requests": requests or []}}, "status": status}


def exactly(device_class: str) -> JSON:
    return {"name": "gpu", "exactly": {"deviceClassName": device_class, "count": 1}}


def first_available(*classes: str) -> JSON:
    subs = [{"name": f"s{i}", "deviceClassName": c} for i, c in enumerate(classes)]
    return {"name": "gpu", "firstAvailable": subs}


def test_pending_claims_are_the_unallocated_ones_not_being_deleted() -> None:
    claims = [claim(), claim(), claim(allocated=True), claim(deleting=True)]
    assert pending_claims(claims) == 2


def test_only_claims_that_ask_for_a_pool_drivers_class_are_pending_demand() -> None:
    # Another driver's waiting claims made the window larger than needed (seen in CI: a
    # claim left waiting by another test's namespace grew the minimum window by one).
    ours = {"composable-gpu", "composable-gpu-local"}
    claims = [
        claim(requests=[exactly("composable-gpu")]),
        claim(requests=[first_available("composable-gpu-local", "composable-gpu")]),
        claim(requests=[exactly("other-vendor-gpu")]),
        claim(requests=[exactly("other-vendor-gpu"), exactly("composable-gpu")]),
        claim(),
        claim(allocated=True, requests=[exactly("composable-gpu")]),
    ]
    assert pending_claims(claims, ours) == 3
    assert pending_claims(claims) == 5  # no classes named: any claim


def test_the_kept_fields_of_a_claim_count_as_the_whole_claim() -> None:
    ours = {"composable-gpu"}
    claims = [
        claim(requests=[first_available("other", "composable-gpu")]),
        claim(requests=[exactly("other")]),
        claim(allocated=True, requests=[exactly("composable-gpu")]),
    ]
    kept = [claim_binding_fields(c) for c in claims]
    assert pending_claims(kept, ours) == pending_claims(claims, ours) == 1
    # An allocated claim keeps no request: thousands of those sit in the informer.
    assert "spec" not in kept[2]
    assert request_classes(kept[0]) == ["other", "composable-gpu"]


def test_with_nothing_pending_a_pool_offers_the_minimum() -> None:
    assert window_size(0, 16, 0, AUTO_POLICY, nodes=SMALL) == MIN_WINDOW
    # A burst over: back to the minimum.
    assert window_size(0, 16, 200, AUTO_POLICY, nodes=SMALL) == MIN_WINDOW


def test_the_window_covers_each_pools_share_of_the_pending_claims_and_a_margin() -> None:
    # 100 claims, one pool: every one fits at once (the fixed window's slowdown).
    assert window_size(100, 1, 0, AUTO_POLICY, nodes=SMALL) == 100 + MARGIN
    # 1,000 claims over 16 pools: 63 each, and the margin.
    assert window_size(1000, 16, 0, AUTO_POLICY, nodes=SMALL) == 63 + MARGIN
    assert window_size(10, 16, 0, AUTO_POLICY, nodes=SMALL) == max(MIN_WINDOW, 1 + MARGIN)


def test_the_window_does_not_shrink_while_claims_are_pending() -> None:
    # A device the scheduler may be picking stays on show.
    assert window_size(20, 1, 116, AUTO_POLICY, nodes=SMALL) == 116


def test_a_fixed_window_or_none_is_kept_as_given() -> None:
    assert window_size(1000, 1, 0, WindowPolicy(8), nodes=SMALL) == 8
    assert window_size(1000, 1, 0, WindowPolicy(0), nodes=SMALL) == 0


def test_the_scheduler_filters_the_nodes_upstream_says() -> None:
    # numFeasibleNodesToFind with percentageOfNodesToScore unset.
    assert [nodes_filtered(n) for n in (4, 100, 300, 1000, 5000, 20000)] == [
        4,
        100,
        144,
        420,
        500,
        1000,
    ]


def test_a_large_cluster_caps_the_automatic_window() -> None:
    # 1,000 claims over 16 pools would be 63 + 8 a pool: at 1,000 nodes each pod would
    # evaluate 71 devices on each of 420 nodes. The cap keeps it to the budget.
    assert window_cap(1000) == EVALUATION_BUDGET // 420 == 4
    assert window_size(1000, 16, 0, AUTO_POLICY, nodes=1000) == 4
    assert window_size(1000, 16, 71, AUTO_POLICY, nodes=1000) == 4  # even if it was larger
    assert window_size(0, 16, 0, AUTO_POLICY, nodes=1000) == 4
    # 100 nodes: 20; a small cluster keeps the pending claims' whole share.
    assert window_size(1000, 16, 0, AUTO_POLICY, nodes=100) == 20
    assert window_size(100, 1, 0, AUTO_POLICY, nodes=4) == 100 + MARGIN
    # A window the user fixed is theirs.
    assert window_size(1000, 16, 0, WindowPolicy(32), nodes=1000) == 32
    assert window_size(1000, 16, 0, WindowPolicy(0), nodes=1000) == 0


@given(nodes=st.integers(0, 50000))
def test_the_cap_keeps_a_pod_within_the_budget(nodes: int) -> None:
    cap = window_cap(nodes)
    assert cap >= 1
    assert cap == 1 or cap * max(1, nodes_filtered(nodes)) <= EVALUATION_BUDGET


@given(
    pending=st.integers(0, 5000),
    pools=st.integers(0, 64),
    last=st.integers(0, 5000),
    nodes=st.integers(0, 50000),
)
def test_an_auto_window_holds_each_pools_share_up_to_the_cap(
    pending: int, pools: int, last: int, nodes: int
) -> None:
    size, cap = window_size(pending, pools, last, AUTO_POLICY, nodes=nodes), window_cap(nodes)
    assert size <= cap
    assert size >= min(MIN_WINDOW, cap)
    assert size == cap or size * max(1, pools) >= pending
    if pending:
        assert size == cap or size >= last


def test_the_flag_takes_auto_zero_or_a_count() -> None:
    assert window_arg("auto") == AUTO
    assert window_arg("0") == 0
    assert window_arg("32") == 32
    with pytest.raises(argparse.ArgumentTypeError):
        window_arg("-2")
    with pytest.raises(ValueError):
        window_arg("many")


def with_uses(claims: list[JSON]) -> tuple[list[JSON], list[ClaimUse]]:
    return claims, [claim_use(c) for c in claims]


def test_the_publisher_sizes_its_window_over_the_pools_of_its_last_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pub = publish.PoolPublisher(None, None)  # type: ignore[arg-type]  # not started
    # The classes whose selectors name the pool's driver (from its DeviceClass informer).
    monkeypatch.setattr(pub.class_clash, "selecting", lambda drivers: {"composable-gpu"})
    mine, other = claim(requests=[exactly("composable-gpu")]), claim(requests=[exactly("x")])
    drivers = {names.DRIVER}
    assert pub._window([], [], drivers, SMALL) == MIN_WINDOW
    # Before its first plan it knows no pool: every pending claim may go to one.
    assert pub._window(*with_uses([mine] * 40 + [other] * 40), drivers, SMALL) == 40 + MARGIN
    assert pub._window([], [], drivers, SMALL) == MIN_WINDOW
    pub._generations = {f"fab/zone-{i}": 1 for i in range(4)}
    assert pub._window(*with_uses([mine] * 40), drivers, SMALL) == 10 + MARGIN
    assert publish.POOL_WINDOW._value.get() == 10 + MARGIN
    assert (
        publish.PoolPublisher(None, None, max_free=0)._window(*with_uses([mine]), drivers, SMALL)  # type: ignore[arg-type]
        == 0
    )
