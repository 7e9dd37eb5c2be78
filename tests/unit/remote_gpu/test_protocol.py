from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_gpu.errors import FrameError
from remote_gpu.protocol import (
    HEADER_SIZE,
    HELLO_KEY,
    DType,
    Flags,
    Header,
    Op,
    dtype_code,
    numpy_dtype,
    session_key,
    unpack,
)

KEY = b"k" * 32


def test_header_round_trips() -> None:
    h = Header(
        Op.INVOKE,
        lease=7,
        seq=9,
        flags=Flags.SHM,
        dtype=DType.FLOAT32,
        part=1,
        parts=2,
        shape=(3, 4),
        offset=4096,
        length=48,
    )
    raw = h.pack(KEY)
    assert len(raw) == HEADER_SIZE == 76
    assert raw[:4] == b"RGPU"
    assert unpack(raw, KEY, 1 << 20) == h


def test_mac_binds_the_header_to_the_key() -> None:
    raw = bytearray(Header(Op.HEARTBEAT, 1, 2).pack(KEY))
    with pytest.raises(FrameError, match="MAC"):
        unpack(raw, b"other" * 8, 0)
    raw[16] ^= 1  # flip a bit of the sequence number
    with pytest.raises(FrameError, match="MAC"):
        unpack(raw, KEY, 0)


def test_length_must_match_dtype_and_shape() -> None:
    bad = Header(Op.RESULT, 1, 1, dtype=DType.INT32, part=1, parts=1, shape=(5,), length=16)
    with pytest.raises(FrameError, match="does not match"):
        unpack(bad.pack(KEY), KEY, 1 << 20)


def test_limits_are_enforced() -> None:
    big = Header(Op.RESULT, 1, 1, dtype=DType.UINT8, part=1, parts=1, shape=(1000,), length=1000)
    with pytest.raises(FrameError, match="exceeds"):
        unpack(big.pack(KEY), KEY, 999)
    with pytest.raises(FrameError):
        Header(Op.INVOKE, 1, 1, shape=(1, 1, 1, 1, 1)).pack(KEY)


def test_dtype_codes_cover_numpy_types() -> None:
    for code in DType:
        if code is DType.NONE:
            continue
        assert dtype_code(numpy_dtype(code)) == code
    with pytest.raises(FrameError):
        dtype_code(np.dtype(object))
    with pytest.raises(FrameError):
        dtype_code(np.dtype(">f4"))


def test_session_keys_differ_per_nonce() -> None:
    mac = bytes(32)
    assert session_key(mac, b"a" * 16, b"b" * 16) != session_key(mac, b"a" * 16, b"c" * 16)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=HEADER_SIZE + 8))
def test_parser_rejects_garbage_with_frame_error_only(data: bytes) -> None:
    with contextlib.suppress(FrameError):
        unpack(data, HELLO_KEY, 1 << 20)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, HEADER_SIZE - 17), st.integers(1, 255))
def test_any_header_corruption_is_detected(index: int, xor: int) -> None:
    raw = bytearray(Header(Op.INVOKE, 3, 4, length=5).pack(HELLO_KEY))
    raw[index] ^= xor
    with pytest.raises(FrameError):
        unpack(raw, HELLO_KEY, 1 << 20)
