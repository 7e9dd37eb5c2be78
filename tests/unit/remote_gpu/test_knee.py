"""The knee model: predicted from measured inputs, read from a measured sweep."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from remote_gpu.knee import LinkModel, measured_knee, predicted_knee


def test_the_knee_is_the_first_count_the_link_cannot_feed() -> None:
    # 64 KiB frames, 66 ms each: 15.2 FPS a GPU; 2.5 MB/s carries 38 FPS.
    model = LinkModel(frame_bytes=65_536, compute_s=0.066, link_bytes_per_s=2.5e6)
    assert round(model.link_fps, 1) == 38.1
    assert predicted_knee(model, 8) == 3  # 2 x 15.2 fits, 3 x 15.2 does not
    assert model.fps(2) == pytest.approx(2 / 0.066) and model.fps(3) == model.link_fps


def test_no_knee_when_the_link_feeds_every_count() -> None:
    model = LinkModel(frame_bytes=1000, compute_s=0.1, link_bytes_per_s=1e6)
    assert predicted_knee(model, 8) is None


def test_a_demand_equal_to_the_link_is_not_past_it() -> None:
    model = LinkModel(frame_bytes=100, compute_s=0.1, link_bytes_per_s=2000)  # 20 FPS
    assert predicted_knee(model, 8) == 3


def test_inputs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        LinkModel(frame_bytes=0, compute_s=0.1, link_bytes_per_s=1)


def test_a_measured_sweep_knees_where_its_plateau_begins() -> None:
    fps = {1: 15.0, 2: 29.5, 3: 37.0, 4: 37.5, 5: 36.8, 6: 37.2, 7: 37.1, 8: 37.4}
    assert measured_knee(fps) == 3
    linear = {n: 15.0 * n for n in range(1, 9)}  # never short of n x one GPU
    assert measured_knee(linear) is None


def test_a_sweep_without_every_count_is_refused() -> None:
    with pytest.raises(ValueError, match="every count"):
        measured_knee({1: 10.0, 3: 20.0})
    with pytest.raises(ValueError, match="one GPU"):
        measured_knee({2: 10.0})


@given(
    st.floats(1e3, 1e6),
    st.floats(0.005, 0.5),
    st.floats(1e5, 1e9),
)
def test_a_sweep_that_follows_the_model_knees_where_the_model_says(
    frame: float, compute: float, link: float
) -> None:
    model = LinkModel(frame, compute, link)
    assume(model.per_gpu_fps <= model.link_fps)  # a knee at 1 leaves a sweep no slope to see
    assert measured_knee({n: model.fps(n) for n in range(1, 9)}) == predicted_knee(model, 8)
