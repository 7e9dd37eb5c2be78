from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_gpu import protocol as wire
from remote_gpu.errors import FrameError

KEY = b"k" * 32


def test_header_round_trips() -> None:
    h = wire.Header(
        wire.Op.INVOKE,
        lease=7,
        seq=9,
        flags=wire.Flags.SHM,
        dtype=wire.DType.FLOAT32,
        part=1,
        parts=2,
        shape=(3, 4),
        offset=4096,
        length=48,
    )
    raw = h.pack(KEY)
    assert len(raw) == wire.HEADER_SIZE == 76
    assert raw[:4] == b"RGPU"
    assert wire.unpack(raw, KEY, 1 << 20) == h


def test_mac_binds_the_header_to_the_key() -> None:
    raw = bytearray(wire.Header(wire.Op.HEARTBEAT, 1, 2).pack(KEY))
    with pytest.raises(FrameError, match="MAC"):
        wire.unpack(raw, b"other" * 8, 0)
    raw[16] ^= 1  # flip a bit of the sequence number
    with pytest.raises(FrameError, match="MAC"):
        wire.unpack(raw, KEY, 0)


def test_length_must_match_dtype_and_shape() -> None:
    bad = wire.Header(
        wire.Op.RESULT, 1, 1, dtype=wire.DType.INT32, part=1, parts=1, shape=(5,), length=16
    )
    with pytest.raises(FrameError, match="does not match"):
        wire.unpack(bad.pack(KEY), KEY, 1 << 20)


def test_limits_are_enforced() -> None:
    big = wire.Header(
        wire.Op.RESULT, 1, 1, dtype=wire.DType.UINT8, part=1, parts=1, shape=(1000,), length=1000
    )
    with pytest.raises(FrameError, match="exceeds"):
        wire.unpack(big.pack(KEY), KEY, 999)
    with pytest.raises(FrameError):
        wire.Header(wire.Op.INVOKE, 1, 1, shape=(1, 1, 1, 1, 1)).pack(KEY)


def test_dtype_codes_cover_numpy_types() -> None:
    for code in wire.DType:
        if code is wire.DType.NONE:
            continue
        assert wire.dtype_code(wire.numpy_dtype(code)) == code
    with pytest.raises(FrameError):
        wire.dtype_code(np.dtype(object))
    with pytest.raises(FrameError):
        wire.dtype_code(np.dtype(">f4"))


def test_session_keys_differ_per_nonce() -> None:
    mac = bytes(32)
    assert wire.session_key(mac, b"a" * 16, b"b" * 16) != wire.session_key(
        mac, b"a" * 16, b"c" * 16
    )


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=wire.HEADER_SIZE + 8))
def test_parser_rejects_garbage_with_frame_error_only(data: bytes) -> None:
    with contextlib.suppress(FrameError):
        wire.unpack(data, wire.HELLO_KEY, 1 << 20)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, wire.HEADER_SIZE - 17), st.integers(1, 255))
def test_any_header_corruption_is_detected(index: int, xor: int) -> None:
    raw = bytearray(wire.Header(wire.Op.INVOKE, 3, 4, length=5).pack(wire.HELLO_KEY))
    raw[index] ^= xor
    with pytest.raises(FrameError):
        wire.unpack(raw, wire.HELLO_KEY, 1 << 20)


ARRAYS: list[wire.ArraySpec] = [
    (wire.DType.FLOAT32, (3, 4), 4096, 48),
    (wire.DType.UINT8, (), 4160, 1),
]


def _ring_message(seq: int = 9) -> bytes:
    return wire.pack_message(KEY, wire.Op.RESULT, 7, seq, 0, b"meta", ARRAYS)


def test_ring_messages_are_the_frames_joined_and_parse_back() -> None:
    data = _ring_message()
    frames = [wire.Header(wire.Op.RESULT, 7, 9, parts=2, length=4).pack(KEY), b"meta"]
    for part, (dtype, shape, offset, length) in enumerate(ARRAYS, start=1):
        h = wire.Header(
            wire.Op.RESULT,
            7,
            9,
            flags=wire.Flags.SHM,
            dtype=wire.DType(dtype),
            part=part,
            parts=2,
            shape=shape,
            offset=offset,
            length=length,
        )
        frames.append(h.pack(KEY))
    assert data == b"".join(frames)
    head = wire.unpack(data[: wire.HEADER_SIZE], KEY, 1 << 16)
    assert wire.unpack_arrays(data, wire.HEADER_SIZE + head.length, KEY, head, 1 << 20) == ARRAYS


@pytest.mark.parametrize("inline", [None, [b"x" * 48, b"y"]])
def test_message_frames_carry_each_array_in_the_arena_or_inline(
    inline: list[bytes] | None,
) -> None:
    frames = wire.message_frames(KEY, wire.Op.RESULT, 7, 9, ARRAYS, inline)
    head = wire.unpack(frames[0][0], KEY, 1 << 16)
    assert (head.op, head.parts, head.length, frames[0][1]) == (wire.Op.RESULT, 2, 0, None)
    shm = wire.Flags.SHM if inline is None else wire.Flags.NONE
    for part, ((raw, payload), (dtype, shape, offset, length)) in enumerate(
        zip(frames[1:], ARRAYS, strict=True), start=1
    ):
        h = wire.unpack(raw, KEY, 1 << 16)
        assert (h.flags, h.dtype, h.part, h.shape, h.offset, h.length) == (
            shm,
            dtype,
            part,
            shape,
            offset,
            length,
        )
        assert payload == (None if inline is None else inline[part - 1])


def test_ring_message_defects_are_frame_errors() -> None:
    data = _ring_message()
    head = wire.unpack(data[: wire.HEADER_SIZE], KEY, 1 << 16)
    at = wire.HEADER_SIZE + head.length
    first, second = data[at : at + wire.HEADER_SIZE], data[at + wire.HEADER_SIZE :]
    other = _ring_message(seq=10)
    cases = {
        "trailing": (data + b"x", "bytes after"),
        "truncated": (data[:-1], "truncated"),
        "swapped": (data[:at] + second + first, "out of sequence"),
        "foreign": (data[:at] + other[at : at + wire.HEADER_SIZE] + second, "out of sequence"),
    }
    for name, (bad, match) in cases.items():
        with pytest.raises(FrameError, match=match):
            wire.unpack_arrays(bad, at, KEY, head, 1 << 20)
            pytest.fail(name)
    with pytest.raises(FrameError, match="MAC"):
        wire.unpack_arrays(data, at, b"other" * 8, head, 1 << 20)
    with pytest.raises(FrameError, match="exceeds"):
        wire.unpack_arrays(data, at, KEY, head, 47)
    inline = wire.Header(
        wire.Op.RESULT, 7, 9, dtype=wire.DType.FLOAT32, part=1, parts=1, shape=(3, 4), length=48
    ).pack(KEY)
    one = head._replace(parts=1)
    with pytest.raises(FrameError, match="inline"):
        wire.unpack_arrays(data[:at] + inline, at, KEY, one, 1 << 20)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2 * wire.HEADER_SIZE - 1), st.integers(1, 255))
def test_any_corruption_of_ring_array_frames_is_detected(index: int, xor: int) -> None:
    data = bytearray(_ring_message())
    at = wire.HEADER_SIZE + 4
    data[at + index] ^= xor
    head = wire.unpack(bytes(data[: wire.HEADER_SIZE]), KEY, 1 << 16)
    with pytest.raises(FrameError):
        wire.unpack_arrays(bytes(data), at, KEY, head, 1 << 20)
