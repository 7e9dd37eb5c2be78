"""The scale-out bench's knees and goals (hack/bench/scaleout.py): what makes it exit
non-zero."""

from __future__ import annotations

from typing import Any

from hack.bench.goals import all_met
from hack.bench.scaleout import goals, knees

# One pod's line, as remote_gpu.workloads.scaleout printed it at 20 Mbit/s.
LINE = {
    "frame_bytes": 65536,
    "result_bytes": 1024,
    "compute_s": 0.067021,
    "fps_by_leases": {"1": 14.5, "2": 29.75, "3": 36.25, "4": 36.5, "5": 36.5, "6": 36.5},
}


def test_knees_from_the_measured_inputs_and_the_sweep() -> None:
    k = knees(LINE, 2_395_202)
    assert k["knee_predicted"] == 3 and k["knee_measured"] == 3 and k["knee_error"] == 0
    assert k["link_fps_predicted"] == 36.55 and k["per_gpu_fps_predicted"] == 14.92
    # A link the model takes for twice as wide predicts a later knee than the sweep shows.
    assert knees(LINE, 2 * 2_395_202)["knee_error"] == 2


def test_the_larger_direction_bounds_the_link() -> None:
    line = {**LINE, "frame_bytes": 1024, "result_bytes": 65536}
    assert knees(line, 2_395_202)["frame_bytes"] == 65536


def test_no_knee_is_a_miss() -> None:
    linear = {**LINE, "fps_by_leases": {str(n): 15.0 * n for n in range(1, 9)}}
    assert knees(linear, 1e9)["knee_error"] is None


def rate(**figures: Any) -> dict[str, Any]:
    return {"ran": True, "knee_error": 0, **figures}


def test_goals() -> None:
    assert all_met(goals({"20mbit": rate(), "45mbit": rate(knee_error=1)}))
    assert not all_met(goals({"20mbit": rate(), "45mbit": rate(knee_error=2)}))
    assert not all_met(goals({"20mbit": rate(), "45mbit": rate(knee_error=None)}))
    assert not all_met(goals({"20mbit": rate(ran=False), "45mbit": rate()}))
