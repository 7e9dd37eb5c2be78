"""The benchmarks' goals: figure, floor or ceiling, and the exit status they decide."""

from __future__ import annotations

import json

import pytest

from dra_driver.device_source import device_name_for
from hack.bench.goals import all_met, finish, goal
from hack.bench.time_to_gpu import goals, shared_gpus


def test_a_goal_keeps_the_figure_and_its_bound() -> None:
    assert goal(0.4, ceiling=0.5) == {"value": 0.4, "ceiling": 0.5, "met": True}
    assert goal(19, floor=20) == {"value": 19, "floor": 20, "met": False}
    assert goal(None, floor=1)["met"] is False  # not measured: missed
    with pytest.raises(ValueError):
        goal(1, floor=1, ceiling=2)
    assert all_met({"a": goal(1, floor=1), "b": goal(0, ceiling=0)})
    assert not all_met({"a": goal(1, floor=1), "b": goal(1, ceiling=0)})


def out(claims: int, **figures: float | int | None) -> dict[str, float | int | None]:
    base: dict[str, float | int | None] = {
        "claims": claims,
        "failed": 0,
        "shared_gpus": 0,
        "bound_at_first_recheck": claims,
        "ready_overhead_p50_s": 0.4,
        "ready_overhead_p99_s": 2.0,
    }
    return {**base, **figures}


def test_time_to_gpu_goals_per_size() -> None:
    assert all_met(goals(out(20)))
    assert set(goals(out(20))) == {
        "failed",
        "shared_gpus",
        "bound_at_first_recheck",
        "ready_overhead_p50_s",
        "ready_overhead_p99_s",
    }
    # The p50 goal is the one of 20 claims; at 100 only the p99 one.
    assert all_met(goals(out(100, ready_overhead_p50_s=1.5)))
    assert not all_met(goals(out(100, ready_overhead_p99_s=3.1)))
    assert not all_met(goals(out(100, failed=22)))
    assert not all_met(goals(out(100, bound_at_first_recheck=65)))
    assert not all_met(goals(out(20, shared_gpus=1)))


def test_shared_gpus_counts_a_gpu_allocated_as_pool_and_local_device() -> None:
    uuids = {"gpu-1": "aaaa-1", "gpu-2": "bbbb-2"}
    allocations = {
        "c1": [("fab/zone-1", "gpu-1")],
        "c2": [("node-1", device_name_for("aaaa-1"))],  # the same GPU, on its node
        "c3": [("fab/zone-1", "gpu-2")],
        "c4": [],
    }
    assert shared_gpus(allocations, uuids) == {
        "gpu-1": ["c1 (fab/zone-1/gpu-1)", f"c2 (node-1/{device_name_for('aaaa-1')})"]
    }
    del allocations["c2"]
    assert shared_gpus(allocations, uuids) == {}


def test_finish_prints_json_last_and_fails_on_a_missed_goal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert finish({"x": 1}, {"x": goal(1, floor=1)}) == 0
    assert finish({"x": 0}, {"x": goal(0, floor=1)}) == 1
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["goals_met"] is False and last["goals"]["x"]["floor"] == 1
