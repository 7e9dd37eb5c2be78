"""The lending policy's pure decisions: the link-busy taint and SLO-aware lease capacity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.lending import netaware
from remote_gpu import slo


def test_the_taint_has_hysteresis() -> None:
    rule = netaware.LinkBusyRule(busy_at=0.7, clear_at=0.5)
    busy = False
    seen = []
    for load in (0.6, 0.7, 0.6, 0.51, 0.5, 0.69, 0.7):
        busy = netaware.link_busy(busy, load, rule)
        seen.append(busy)
    # On at 0.7, stays on down to 0.5 exclusive, off at 0.5, on again only at 0.7.
    assert seen == [False, True, True, True, False, False, True]


@settings(max_examples=200)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=40))
def test_a_load_between_the_thresholds_never_changes_the_state(loads: list[float]) -> None:
    rule = netaware.LinkBusyRule(busy_at=0.7, clear_at=0.5)
    busy = False
    for load in loads:
        after = netaware.link_busy(busy, load, rule)
        if rule.clear_at < load < rule.busy_at:
            assert after == busy
        busy = after


def test_rules_that_cannot_work_are_refused() -> None:
    with pytest.raises(netaware.PolicyError, match="clear_at < busy_at"):
        netaware.LinkBusyRule(busy_at=0.4, clear_at=0.6)
    with pytest.raises(netaware.PolicyError):
        netaware.link_load([1.0], 0)


def test_only_sensitive_claims_keep_off_a_busy_donor() -> None:
    assert netaware.may_place(network_sensitive=True, donor_busy=False)
    assert not netaware.may_place(network_sensitive=True, donor_busy=True)
    assert netaware.may_place(network_sensitive=False, donor_busy=True)
    assert netaware.device_taint(False) is None
    taint = netaware.device_taint(True)
    assert taint is not None and taint["key"] == netaware.INSENSITIVE_TOLERATION["key"]
    assert taint["effect"] == "NoSchedule"


def test_link_load_is_a_capped_fraction() -> None:
    assert netaware.link_load([30e9, 20e9], 100e9) == pytest.approx(0.5)
    assert netaware.link_load([300e9], 100e9) == 1.0


def test_fit_recovers_a_linear_model_and_bounds_every_sample() -> None:
    samples = [(k, 0.010 + 0.005 * (k - 1)) for k in (1, 2, 3, 4)]
    model = slo.fit([*samples, (2, 0.016)])
    assert model.growth_s == pytest.approx(0.005, rel=0.1)
    assert all(model.latency(k) >= t - 1e-12 for k, t in [*samples, (2, 0.016)])


def test_fit_at_one_concurrency_assumes_time_slicing() -> None:
    model = slo.fit([(2, 0.02), (2, 0.02)])
    assert model.latency(1) == pytest.approx(0.01)
    assert model.latency(4) == pytest.approx(0.04)
    with pytest.raises(slo.ModelError):
        slo.fit([(0, 1.0), (3, float("nan"))])


def test_capacity_keeps_every_admitted_slo_and_never_passes_the_knee() -> None:
    models = {"mm": slo.LatencyModel(service_s=0.010, growth_s=0.010)}
    tight = slo.Lease("mm", slo_s=0.030)  # holds up to 3 leases
    loose = slo.Lease("mm", slo_s=1.0)
    assert slo.lease_capacity([tight], models, knee=8) == 3
    assert slo.lease_capacity([loose], models, knee=5) == 5
    assert slo.lease_capacity([], models, knee=5) == 5
    assert slo.free_leases([tight, loose], models, knee=8) == 1
    # A lease that would break an admitted SLO is not offered.
    assert not slo.admit([tight, loose, loose], loose, models, knee=8)
    # Nor one that cannot meet its own.
    assert not slo.admit([loose], slo.Lease("mm", slo_s=0.015), models, knee=8)
    # An unknown function with an SLO cannot be promised anything.
    assert not slo.admit([], slo.Lease("other", slo_s=1.0), models, knee=8)


@settings(max_examples=200)
@given(
    st.lists(st.floats(0.001, 1.0), min_size=0, max_size=6),
    st.floats(0.001, 0.1),
    st.floats(0.0, 0.1),
    st.integers(1, 16),
)
def test_capacity_is_safe(slos: list[float], service: float, growth: float, knee: int) -> None:
    models = {"f": slo.LatencyModel(service, growth)}
    admitted = [slo.Lease("f", s) for s in slos]
    cap = slo.lease_capacity(admitted, models, knee)
    assert cap >= len(admitted)
    if cap > len(admitted):
        assert cap <= knee and slo.fits(admitted, models, cap)
