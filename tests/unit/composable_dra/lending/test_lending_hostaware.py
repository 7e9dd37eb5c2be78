"""The host-busy taint's pure decisions (hack/sim/hostaware.py)."""

from __future__ import annotations

import pytest

from composable_dra.lending import netaware
from hack.sim import hostaware


def test_a_host_is_busy_from_the_load_that_slows_a_co_runner_to_the_tolerance() -> None:
    # Others' traffic filling the host slows a job by 20%: 10% is reached at half load.
    rule = hostaware.crowding_rule(0.10, 0.20)
    assert rule.busy_at == pytest.approx(0.5)
    assert rule.clear_at == pytest.approx(0.5 * 5 / 7)
    # A host that even full stays inside the tolerance is busy only when full.
    assert hostaware.crowding_rule(0.10, 0.05).busy_at == 1.0


@pytest.mark.parametrize(("tolerance", "slowdown"), [(0.0, 0.2), (0.1, -1.0), (-0.1, 0.2)])
def test_a_profile_that_gives_no_threshold_is_refused(tolerance: float, slowdown: float) -> None:
    with pytest.raises(netaware.PolicyError):
        hostaware.crowding_rule(tolerance, slowdown)


def test_only_claims_that_tolerate_crowding_take_a_crowded_hosts_gpu() -> None:
    assert not hostaware.may_place(False, True)
    assert hostaware.may_place(True, True)
    assert hostaware.may_place(False, False)
    assert hostaware.device_taint(False) is None
    taint = hostaware.device_taint(True)
    assert taint is not None and taint["key"] == hostaware.CROWDING_TOLERATION["key"]
    assert taint["effect"] == hostaware.CROWDING_TOLERATION["effect"] == "NoSchedule"
