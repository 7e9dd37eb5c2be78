"""A benchmark's goals in its last JSON line: each figure with its floor or ceiling.

    return finish(out, {"failed": goal(3, ceiling=0), "fps": goal(61.2, floor=55)})

``finish`` prints the JSON line last and gives the exit status: non-zero when a goal is
missed.

A figure that could not be measured (None) misses its goal.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def goal(
    value: float | None, *, floor: float | None = None, ceiling: float | None = None
) -> dict[str, Any]:
    if (floor is None) == (ceiling is None):
        raise ValueError("a goal has a floor or a ceiling")
    if floor is not None:
        return {"value": value, "floor": floor, "met": value is not None and value >= floor}
    assert ceiling is not None
    return {"value": value, "ceiling": ceiling, "met": value is not None and value <= ceiling}


def all_met(goals: Mapping[str, Mapping[str, Any]]) -> bool:
    return all(bool(g["met"]) for g in goals.values())


def finish(out: dict[str, Any], goals: Mapping[str, Mapping[str, Any]]) -> int:
    """Put ``goals`` and ``goals_met`` into ``out``, print it as the last line, and return
    the benchmark's exit status: 0 when every goal is met, 1 otherwise."""
    out["goals"] = dict(goals)
    out["goals_met"] = all_met(goals)
    print(json.dumps(out), flush=True)
    return 0 if out["goals_met"] else 1
