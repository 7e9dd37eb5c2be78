"""hack/bench/stats.py: the benches' one percentile (nearest rank)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hack.bench.stats import percentile, percentile_or_none


def test_nearest_rank() -> None:
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [percentile(values, q) for q in (0.0, 0.5, 0.99, 1.0)] == [1.0, 3.0, 5.0, 5.0]


def test_no_values_or_a_bad_q_are_refused() -> None:
    assert percentile_or_none([], 0.5) is None
    with pytest.raises(ValueError):
        percentile([], 0.5)
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_a_percentile_is_one_of_the_values_and_grows_with_q(values: list[float], q: float) -> None:
    got = percentile(values, q)
    assert got in values and percentile(values, 0.0) <= got <= percentile(values, 1.0)
