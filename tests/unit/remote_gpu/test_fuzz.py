"""Bounded fuzzing of every parser that faces the network, on both sides of a lease:
frame headers and ring entries (donor and client), and the handshake's messages
(CHALLENGE and the donor's reply on the client, HELLO on the donor, ERROR bodies on
both). Each parser must answer any input with its typed error (FrameError, or AuthError
for a proof that fails) or a value it can use; nothing else may escape. Derandomized,
no example database: the same few seconds of examples in every run."""

from __future__ import annotations

import json
import math
import socket
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_gpu import handshake, tokens
from remote_gpu.errors import AuthError, FrameError, RemoteGPUError
from remote_gpu.protocol import (
    _STRUCT,
    HEADER_SIZE,
    HELLO_KEY,
    MAGIC,
    MAX_META,
    VERSION,
    DType,
    Header,
    Op,
    mac,
    numpy_dtype,
    seq_after,
    unpack,
    unpack_arrays,
)

from .conftest import Running
from .test_hardening import _frame

KEY = b"k" * 32
LIMIT = 1 << 16  # payload limit: whatever passes must be cheap to build


def _fuzz(n: int) -> settings:
    return settings(max_examples=n)


U32 = st.sampled_from([0, 1, 2, 3, 7, 255]) | st.sampled_from(
    [1 << 16, (1 << 31) - 1, (1 << 32) - 1]
)
SHAPES = st.lists(U32, max_size=4)


def _dims(f: dict[str, Any]) -> tuple[int, list[int]]:
    shape = f["shape"]
    ndim = len(shape) if f["ndim"] < 0 else f["ndim"]
    dims = [*shape, 0, 0, 0, 0][:4]
    if f["junk"] is not None and ndim < 4:
        dims = [d or j for d, j in zip(dims, f["junk"], strict=True)]
    return ndim, dims


def _raw_header(key: bytes, **f: Any) -> bytes:
    ndim, dims = _dims(f)
    body = _STRUCT.pack(
        MAGIC, VERSION, f["op"], f["flags"], f["dtype"], 1, 2, f["part"], f["parts"], ndim,
        dims[0], dims[1], dims[2], dims[3], f["offset"], f["length"],
    )  # fmt: skip
    return body + mac(key, body)


def _mostly(valid: list[int], invalid: list[int]) -> st.SearchStrategy[int]:
    return st.sampled_from(valid * 4 + invalid)


# Mostly well-formed array frames (so that the checks after the first ones are reached),
# with every field sometimes out of range.
HEADERS = st.fixed_dictionaries(
    {
        "op": _mostly([2, 3], [0, 1, 4, 5, 6, 7, 8, 255]),
        "flags": _mostly([0, 1], [2, 3, 255]),
        "dtype": _mostly(list(range(1, 15)), [0, 15, 255]),
        "part": _mostly([1, 2], [0, 3, 65535]),
        "parts": _mostly([2, 3], [0, 1, 64, 65, 65535]),
        "shape": SHAPES,
        "ndim": _mostly([-1], [0, 1, 4, 5, 255]),  # -1: the shape's
        # in unused dimensions, now and then
        "junk": st.sampled_from([None] * 6) | st.lists(U32, min_size=4, max_size=4),
        "offset": st.integers(0, 1 << 20),
        "length": _mostly([-1], [0, 1, 1 << 16, 1 << 17]),  # -1: the consistent one
    }
)


def _consistent_length(f: dict[str, Any]) -> int:
    ndim, dims = _dims(f)
    if f["length"] >= 0 or not 1 <= f["dtype"] <= 14 or ndim > 4:
        return max(0, int(f["length"]))
    return math.prod(dims[:ndim]) * numpy_dtype(f["dtype"]).itemsize


def test_a_shape_numpy_cannot_build_is_refused() -> None:
    """A zero dimension makes the payload empty, yet numpy refuses the other dimensions'
    product; the parser let such shapes through to the worker and the client."""
    huge = Header(
        Op.RESULT, 1, 1, dtype=DType.UINT8, part=1, parts=1, shape=(0, 2**32 - 1, 2**32 - 1)
    )
    with pytest.raises(ValueError):
        np.empty(huge.shape, np.uint8)
    with pytest.raises(FrameError, match="shape"):
        unpack(huge.pack(KEY), KEY, 1 << 40)
    fine = huge._replace(shape=(0, 1000))
    assert unpack(fine.pack(KEY), KEY, 1 << 20).shape == (0, 1000)


@_fuzz(300)
@given(st.lists(U32, max_size=3), st.integers(0, 3), st.integers(1, 14))
def test_empty_arrays_pass_only_if_numpy_can_build_them(
    dims: list[int], at: int, dtype: int
) -> None:
    shape = (*dims[:at], 0, *dims[at:])
    h = Header(Op.RESULT, 1, 1, dtype=DType(dtype), part=1, parts=1, shape=shape, length=0)
    try:
        unpack(h.pack(KEY), KEY, LIMIT)
    except FrameError:
        return
    assert np.empty(shape, numpy_dtype(dtype)).nbytes == 0


@_fuzz(800)
@given(HEADERS)
def test_any_header_the_parser_accepts_numpy_can_build(f: dict[str, Any]) -> None:
    f = {**f, "length": _consistent_length(f)}
    if f["length"] >= 1 << 64:
        return
    try:
        h = unpack(_raw_header(KEY, **f), KEY, LIMIT)
    except FrameError:
        return
    assert h.length <= LIMIT and len(h.shape) <= 4
    if h.part:
        a = np.empty(h.shape, numpy_dtype(h.dtype))
        assert a.nbytes == h.length


@_fuzz(300)
@given(st.lists(HEADERS, min_size=1, max_size=3), st.binary(max_size=40))
def test_ring_entries_parse_or_raise_frame_errors(
    frames: list[dict[str, Any]], tail: bytes
) -> None:
    parts = len(frames)
    head = Header(Op.RESULT, 1, 2, parts=parts, length=0)
    data = head.pack(KEY) + b"".join(
        _raw_header(KEY, **{**f, "length": _consistent_length(f), "op": int(Op.RESULT)})
        for f in frames
        if _consistent_length(f) < 1 << 64
    )
    data += tail
    try:
        specs = unpack_arrays(data, HEADER_SIZE, KEY, head, LIMIT)
    except FrameError:
        return
    for dtype, shape, _, n in specs:
        assert np.empty(shape, numpy_dtype(dtype)).nbytes == n <= LIMIT


@_fuzz(300)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_sequence_numbers_are_a_strict_order_across_the_wrap(seq: int, last: int) -> None:
    assert not seq_after(last, last)
    assert not (seq_after(seq, last) and seq_after(last, seq))
    assert seq_after((last + 1) % 2**32, last)


# ---- the handshake's messages

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
SPECIAL = st.sampled_from(
    [b"Infinity", b"-Infinity", b"NaN", b"1e999", b"9" * 400, b"[" * 3000, b'"\xff"']
)


NONCE = st.binary(min_size=16, max_size=16).map(bytes.hex)
VALID: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "hello": {
        "versions": st.just([VERSION]),
        "lease": st.just(7) | st.integers(0, 2**64 - 1),  # the frame's: 7
        "donor": st.text(max_size=20),
        "expiry": st.floats(0, 1e12),
        "nonce": NONCE,
        "transport": st.sampled_from(["auto", "shm", "tcp", "ucx"]),
        "host": st.text(max_size=20),
        "credits": st.integers(1, 64),
        "frame_bytes": st.integers(0, 1 << 30),
        "target_rate": st.floats(0, 1e6),
        "ring": st.booleans(),
    },
    "accept": {
        "version": st.just(VERSION),
        "donor": st.text(max_size=20),
        "credits": st.integers(1, 8),
        "transport": st.sampled_from(["shm", "tcp", "ucx"]),
        "slot_size": st.integers(1, 1 << 30),
        "functions": st.lists(st.text(max_size=10), max_size=3),
        "arena": st.text(max_size=70),
        "arena_size": st.integers(1, 1 << 40),
        "ring": st.fixed_dictionaries({"entries": st.integers(1, 8)}),
    },
    "challenge": {"versions": st.just([VERSION]), "nonce": NONCE},
    "error": {
        "code": st.sampled_from(["bad_frame", "auth_failed", "nonsense"]),
        "message": st.text(),
    },
}


def _bodies(kind: str) -> st.SearchStrategy[bytes]:
    """A well-formed message, or one with a field changed, dropped or added (any JSON
    value, or one JSON allows only by accident: Infinity, deep nesting, invalid UTF-8),
    or no JSON at all."""
    fields = VALID[kind]
    keys = st.sampled_from([*fields, "token", "mac"])

    def change(d: dict[str, Any], key: str, value: Any, how: int) -> bytes:
        d = dict(d)
        if how == 0:
            d.pop(key, None)
        elif how == 1:
            d[key] = value
        return json.dumps(d).encode()

    def spliced(d: dict[str, Any], bad: bytes, key: str) -> bytes:
        d = {k: v for k, v in d.items() if k != key}
        return b'{"' + key.encode() + b'": ' + bad + b", " + json.dumps(d).encode()[1:]

    valid = st.fixed_dictionaries(fields)
    return st.one_of(
        valid.map(lambda d: json.dumps(d).encode()),
        st.builds(change, valid, keys, JSON, st.integers(0, 2)),
        st.builds(spliced, valid, SPECIAL, st.sampled_from(list(fields))),
        st.binary(max_size=200),
    )


def _meta_frame(op: Op, lease: int, meta: bytes) -> tuple[Header, bytes]:
    raw = Header(op, lease, 0, length=len(meta)).pack(HELLO_KEY)
    return unpack(raw, HELLO_KEY, MAX_META), raw


@_fuzz(400)
@given(_bodies("hello"), st.binary(min_size=0, max_size=40))
def test_hello_parsing_raises_only_frame_errors(body: bytes, proof: bytes) -> None:
    header, raw = _meta_frame(Op.HELLO, 7, body + proof)
    try:
        hello, covered, got = handshake.parse_hello(header, raw, body + proof)
    except FrameError:
        return
    assert hello.lease == 7 and len(got) == handshake.PROOF_SIZE and covered.endswith(body)
    assert all(math.isfinite(x) for x in (hello.expiry, hello.target_rate))


@_fuzz(300)
@given(_bodies("challenge"))
def test_challenge_parsing_raises_only_frame_errors(body: bytes) -> None:
    header, _ = _meta_frame(Op.CHALLENGE, 0, body)
    try:
        challenge, nonce = handshake.parse_challenge(header, body)
    except RemoteGPUError as exc:
        assert isinstance(exc, FrameError)
        return
    assert len(nonce) == handshake.NONCE_SIZE and challenge.versions


@_fuzz(400)
@given(_bodies("accept"), st.booleans())
def test_accept_parsing_raises_only_typed_errors(body: bytes, proven: bool) -> None:
    """Proven replies reach the JSON parser; unproven ones must stop at the proof."""
    key, nonce = b"s" * 32, b"n" * 16
    raw = Header(Op.HELLO, 7, 0, length=len(body) + handshake.PROOF_SIZE).pack(HELLO_KEY)
    proof = handshake._prove(key if proven else b"x" * 32, b"rgpu-accept", nonce, raw[:60], body)
    meta = body + proof
    header = unpack(raw, HELLO_KEY, MAX_META)
    try:
        accept = handshake.parse_accept(header, raw, meta, key, nonce)
    except AuthError:
        assert not proven
        return
    except FrameError:
        return
    assert proven and accept.credits >= 1


@_fuzz(300)
@given(_bodies("error"))
def test_error_bodies_become_typed_errors(body: bytes) -> None:
    assert isinstance(handshake.parse_error(body), RemoteGPUError)


@_fuzz(300)
@given(st.floats(min_value=0, max_value=1e12), st.integers(0, 2**64 - 1))
def test_token_claims_survive_the_hello_exactly(expiry: float, lease: int) -> None:
    """The donor recomputes the token's MAC from the claims the HELLO carries: they must
    come through JSON bit for bit, or genuine tokens would fail."""
    secret = b"fuzz-secret-0123456789"
    tok = tokens.Token(lease, "d", expiry, tokens._digest(secret, lease, "d", expiry))
    hello = handshake.Hello(
        versions=[VERSION], lease=lease, donor="d", expiry=expiry, nonce="00" * 16
    )
    header, meta = handshake.hello_frame(hello, tok.mac_bytes, b"c" * 16)
    parsed, covered, proof = handshake.parse_hello(
        unpack(header, HELLO_KEY, MAX_META), header, meta
    )
    secret_again = tokens.mac_for(secret, parsed.lease, parsed.donor, parsed.expiry)
    assert secret_again == tok.mac_bytes
    handshake.check_hello_proof(secret_again, b"c" * 16, covered, proof)


@_fuzz(60)
@given(_bodies("hello"))
def test_a_live_donor_answers_any_hello_with_a_typed_error(donor: Running, body: bytes) -> None:
    meta = body + bytes(handshake.PROOF_SIZE)
    head = Header(Op.HELLO, 1, 0, length=len(meta)).pack(HELLO_KEY)
    with socket.create_connection((donor.host, donor.port), timeout=10) as s:
        assert _frame(s) is not None  # the challenge
        s.sendall(head + meta)
        answer = _frame(s)
    assert answer is not None, "the donor hung up without an ERROR"
    assert answer[0].op == Op.ERROR
