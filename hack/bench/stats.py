"""The benches' one percentile (nearest rank), so that every p50 and p99 they report
means the same thing."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The value at rank ``round(q * (n - 1))`` of the sorted ``values`` (0 <= q <= 1);
    ValueError for no values (a bench reports None for them, not a number)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must lie in [0, 1], got {q}")
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def percentile_or_none(values: Sequence[float], q: float) -> float | None:
    """``percentile``, or None for no values (a figure a bench could not measure)."""
    return percentile(values, q) if values else None
