"""The pipeline-block wire: arrays round-trip; anything else from the network is a typed
refusal (fuzzed)."""

from __future__ import annotations

import contextlib
import io
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_gpu.block_wire import BadBlockRequest, block_name, decode, encode, frame_number


def test_arrays_round_trip_in_order() -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, dtype=np.int64)
    got = decode(encode([a, b]))
    assert len(got) == 2 and np.array_equal(got[0], a) and np.array_equal(got[1], b)
    assert got[0].dtype == np.float32


def test_pickles_compression_and_too_many_arrays_are_refused() -> None:
    obj = io.BytesIO()
    np.savez(obj, np.array([{"x": 1}], dtype=object))
    with pytest.raises(BadBlockRequest):
        decode(obj.getvalue())
    small = io.BytesIO()
    np.savez_compressed(small, np.zeros(1 << 20, dtype=np.uint8))
    with pytest.raises(BadBlockRequest, match="compressed"):
        decode(small.getvalue())
    with pytest.raises(BadBlockRequest, match="1 to 8"):
        decode(encode([np.zeros(1)] * 9))
    named = io.BytesIO()
    np.savez(named, x=np.zeros(1))
    with pytest.raises(BadBlockRequest, match="arr_0"):
        decode(named.getvalue())


def test_names_and_numbers_are_checked() -> None:
    assert block_name({"block": "reid-blocks-5d8f-x2"}) == "reid-blocks-5d8f-x2"
    assert frame_number({"frame": "42"}) == 42
    for bad in ({}, {"block": "../x"}, {"block": "A"}, {"block": "-a"}, {"block": "a" * 64}):
        with pytest.raises(BadBlockRequest):
            block_name(bad)
    for raw in ("", "-1", "1e3", "0x1", "1" * 19, " 1"):
        with pytest.raises(BadBlockRequest):
            frame_number({"frame": raw})


@settings(max_examples=400)
@given(st.binary(max_size=2048))
def test_any_body_is_arrays_or_a_typed_refusal(body: bytes) -> None:
    with contextlib.suppress(BadBlockRequest):
        decode(body)


@settings(max_examples=200)
@given(st.binary(max_size=512), st.integers(0, 200))
def test_a_damaged_npz_is_a_typed_refusal(noise: bytes, at: int) -> None:
    good = bytearray(encode([np.arange(16, dtype=np.float32)]))
    at = at % len(good)
    damaged = bytes(good[:at]) + noise + bytes(good[at + len(noise) :])
    with contextlib.suppress(BadBlockRequest):
        decode(damaged)


def test_a_zip_that_is_not_npz_is_refused() -> None:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("arr_0.npy", b"not an array")
    with pytest.raises(BadBlockRequest):
        decode(out.getvalue())
