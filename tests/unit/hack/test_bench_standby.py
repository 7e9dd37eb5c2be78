"""The warm-standby bench's goals (hack/bench/standby.py): what makes it exit non-zero."""

from __future__ import annotations

from typing import Any

from hack.bench.goals import all_met
from hack.bench.standby import goals


def side(**figures: Any) -> dict[str, Any]:
    base = {"bound_p50_s": 0.7, "bound_p99_s": 0.9, "standby_idle_max": 8, "failed": 0}
    return {**base, "bound_first_attempt": 8, **figures}


def test_standby_goals() -> None:
    without = side(bound_p50_s=15.3, standby_idle_max=0)
    assert all_met(goals(side(), without, 8, 8))
    assert not all_met(goals(side(bound_p50_s=1.2), without, 8, 8))
    assert not all_met(goals(side(bound_p50_s=None), without, 8, 8))  # nothing bound
    assert not all_met(goals(side(standby_idle_max=9), without, 8, 8))  # over the policy
    assert not all_met(goals(side(failed=1), without, 8, 8))
    assert not all_met(goals(side(bound_first_attempt=7), without, 8, 8))  # one waited
    assert not all_met(goals(side(), side(failed=2), 8, 8))
    assert goals(side(), without, 8, 8)["standby_idle_max"] == {
        "value": 8,
        "ceiling": 8,
        "met": True,
    }
