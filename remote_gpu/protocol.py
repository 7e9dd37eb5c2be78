"""The framed binary protocol.

Every frame starts with a fixed 76-byte little-endian header::

    offset size field
    0      4    magic      b"RGPU"
    4      1    version    protocol version (HELLO: the sender's highest)
    5      1    op         HELLO, INVOKE, RESULT, ERROR, HEARTBEAT, CLOSE, CHALLENGE
    6      1    flags      SHM: the payload lies in the lease's shared arena, not inline
    7      1    dtype      array element type (NONE for the head frame)
    8      8    lease      lease id
    16     4    seq        request sequence number (a reply echoes its request's)
    20     2    part       0 for a message's head frame, 1..parts for its arrays
    22     2    parts      number of array frames that follow the head frame
    24     1    ndim       0..4
    25     3    reserved   zero
    28     16   shape      4 x u32, unused dimensions zero
    44     8    offset     arena offset (SHM frames; the slot base on an INVOKE head)
    52     8    length     payload length in bytes
    60     16   mac        keyed BLAKE2b-128 over bytes 0..59

A message is a head frame (part 0) whose payload is small metadata (JSON for the
handshake and ERROR, the function name for INVOKE, empty otherwise) followed by ``parts``
array frames. An array's shape must be one numpy can build within the receiver's payload
limit (the product of its non-zero dimensions times the item size); its length must be
exactly that product.

The handshake (``remote_gpu.handshake``) runs under a fixed public MAC key (integrity
against corruption only) and proves everything that matters with secrets instead:

1. donor -> client, as soon as the connection is accepted: CHALLENGE, JSON
   ``{"versions": [...], "nonce": <16 random bytes, hex>}`` (the server nonce).
2. client -> donor: HELLO, JSON ``{"versions", "lease", "donor", "expiry"`` (the token's
   claims, not its MAC) ``, "nonce"`` (the client nonce) ``, "transport", "host",
   "credits", "frame_bytes", "target_rate", "ring"}``, then a 32-byte proof of
   possession: keyed BLAKE2b (key: the token's MAC, person ``rgpu-hello``) over the server
   nonce, the HELLO's header bytes 0..59 and the JSON. The token's MAC never travels; a
   proof is good for one challenge only. The metadata is 4 KiB at most and parsed
   strictly (no unknown fields, no non-finite or out-of-range numbers, bounded nesting).
   A client that has not sent its HELLO within the donor's ``handshake_timeout`` gets
   ERROR ``deadline_exceeded`` and is dropped; the token of a lease that has closed is
   refused until it expires.
3. donor -> client: HELLO (the reply), JSON ``{"version", "donor", "credits",
   "transport", "slot_size", "functions"}`` plus, for shared memory, ``"arena"`` (a file
   name, ``remote-gpu-<lease as 16 hex digits>-<16 hex digits>``, never a path),
   ``"arena_size"`` and ``"ring": {"entries"}``; then a 32-byte proof keyed with the
   session key (person ``rgpu-accept``) over the client nonce, the reply's header bytes
   0..59 and the JSON. Or ERROR, JSON ``{"code", "message"}``, and the connection ends.

Afterwards both sides MAC every header with the session key, derived from the token's MAC
and the two nonces, so a frame cannot be forged or moved into another session without the
token. The client maps a shared-memory arena only from the shm directory, by the name
checked against its lease, without following links, and only after the seal the donor
wrote into the arena's last page verifies with the session key (``remote_gpu.arena``).
The MAC covers the header, which includes the payload length; payload bytes themselves
are not MACed (that would cost more than the transfer on fast links).

Within a session the requests on one channel (a connection, or a shared-memory lease's
request ring) carry increasing sequence numbers (modulo 2**32, ``seq_after``): a replayed
or reordered request is refused with ``bad_sequence`` and ends the session.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections.abc import Sequence
from enum import IntEnum, IntFlag
from typing import Any, NamedTuple

import numpy as np

from remote_gpu.errors import Code, Fatal, FrameError

MAGIC = b"RGPU"
# 2: challenge-response handshake, sealed arenas, sequence checks; 3: the donor's reply
# names the functions declared idempotent (a v2 peer's reply model refuses that field, so
# a donor says it only to a client that speaks 3: donors and clients upgrade in any order).
VERSION = 3
SUPPORTED_VERSIONS = frozenset({2, 3})
MAX_NDIM = 4
MAX_PARTS = 64
MAX_META = 64 * 1024
MAC_SIZE = 16
HELLO_KEY = b"remote-gpu/hello/v1"
SEQ_MOD = 1 << 32

_STRUCT = struct.Struct("<4sBBBBQIHHB3x4IQQ")
HEADER_SIZE = _STRUCT.size + MAC_SIZE
_BODY = _STRUCT.size
assert HEADER_SIZE == 76


class Op(IntEnum):
    HELLO = 1
    INVOKE = 2
    RESULT = 3
    ERROR = 4
    HEARTBEAT = 5
    CLOSE = 6
    CHALLENGE = 7


class Flags(IntFlag):
    NONE = 0
    SHM = 1


class DType(IntEnum):
    NONE = 0
    BOOL = 1
    INT8 = 2
    UINT8 = 3
    INT16 = 4
    UINT16 = 5
    INT32 = 6
    UINT32 = 7
    INT64 = 8
    UINT64 = 9
    FLOAT16 = 10
    FLOAT32 = 11
    FLOAT64 = 12
    COMPLEX64 = 13
    COMPLEX128 = 14


_NUMPY: dict[int, np.dtype[np.generic]] = {
    DType.BOOL: np.dtype("bool"),
    DType.INT8: np.dtype("<i1"),
    DType.UINT8: np.dtype("<u1"),
    DType.INT16: np.dtype("<i2"),
    DType.UINT16: np.dtype("<u2"),
    DType.INT32: np.dtype("<i4"),
    DType.UINT32: np.dtype("<u4"),
    DType.INT64: np.dtype("<i8"),
    DType.UINT64: np.dtype("<u8"),
    DType.FLOAT16: np.dtype("<f2"),
    DType.FLOAT32: np.dtype("<f4"),
    DType.FLOAT64: np.dtype("<f8"),
    DType.COMPLEX64: np.dtype("<c8"),
    DType.COMPLEX128: np.dtype("<c16"),
}
_CODES: dict[np.dtype[np.generic], DType] = {v: DType(k) for k, v in _NUMPY.items()}
_ITEMSIZE: dict[int, int] = {int(k): v.itemsize for k, v in _NUMPY.items()}
# Plain lookups instead of enum construction: the parser runs once per frame.
_OPS: dict[int, Op] = {int(o): o for o in Op}
_DTYPES: dict[int, DType] = {int(d): d for d in DType}
_FLAGS: dict[int, Flags] = {0: Flags.NONE, 1: Flags.SHM}
_SHM = int(Flags.SHM)  # plain ints in the hot paths: an enum member costs a class lookup


def seq_after(seq: int, last: int) -> bool:
    """Whether ``seq`` comes after ``last`` (serial number arithmetic modulo 2**32: less
    than half the sequence space ahead)."""
    return 0 < (seq - last) % SEQ_MOD < SEQ_MOD >> 1


def _buildable(shape: tuple[int, ...], itemsize: int, max_length: int) -> bool:
    """A shape with a zero dimension has no payload, but numpy still refuses one whose
    other dimensions multiply past its limits; bound them by the payload limit."""
    return math.prod(d or 1 for d in shape) * itemsize <= max_length


def _shape(ndim: int, dims: tuple[int, int, int, int]) -> tuple[int, ...]:
    """The shape a header's ``ndim`` and four dimension fields describe."""
    if ndim > MAX_NDIM:
        raise FrameError(f"ndim {ndim} > {MAX_NDIM}")
    if ndim < MAX_NDIM and any(dims[ndim:]):
        raise FrameError("shape has dimensions beyond ndim")
    return dims[:ndim]


def _check_payload(shape: tuple[int, ...], itemsize: int, length: int, max_length: int) -> None:
    """An array frame's length is exactly its shape's, and numpy can build the shape."""
    if math.prod(shape) * itemsize != length:
        raise FrameError(f"length {length} does not match dtype and shape")
    if not length and not _buildable(shape, itemsize, max_length):
        raise FrameError(f"shape {shape} exceeds the payload limit")


def dtype_code(dtype: np.dtype[np.generic]) -> DType:
    code = _CODES.get(dtype)  # a big-endian dtype equals none of these
    if code is None:
        raise FrameError(f"unsupported dtype {dtype}")
    return code


def numpy_dtype(code: int) -> np.dtype[np.generic]:
    return _NUMPY[code]


class Header(NamedTuple):
    op: Op
    lease: int
    seq: int
    version: int = VERSION
    flags: Flags = Flags.NONE
    dtype: DType = DType.NONE
    part: int = 0
    parts: int = 0
    shape: tuple[int, ...] = ()
    offset: int = 0
    length: int = 0

    def pack(self, key: bytes) -> bytes:
        return pack(
            key,
            self.op,
            self.lease,
            self.seq,
            self.flags,
            self.dtype,
            self.part,
            self.parts,
            self.shape,
            self.offset,
            self.length,
            self.version,
        )

    @property
    def nbytes_expected(self) -> int:
        """Payload size implied by dtype and shape (array frames only)."""
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]


def pack(
    key: bytes,
    op: int,
    lease: int,
    seq: int,
    flags: int = 0,
    dtype: int = 0,
    part: int = 0,
    parts: int = 0,
    shape: tuple[int, ...] = (),
    offset: int = 0,
    length: int = 0,
    version: int = VERSION,
) -> bytes:
    """One header, MACed with ``key`` (what ``Header.pack`` does, without the tuple)."""
    ndim = len(shape)
    if ndim > MAX_NDIM:
        raise FrameError(f"shape {shape} does not fit the header")
    dims = (*shape, 0, 0, 0, 0)
    try:
        body = _STRUCT.pack(
            MAGIC, version, op, flags, dtype, lease, seq, part, parts, ndim,
            dims[0], dims[1], dims[2], dims[3], offset, length,
        )  # fmt: skip
    except struct.error:
        raise FrameError(f"header fields out of range (shape {shape})") from None
    h = (_KEYED.get(key) or _keyed(key)).copy()
    h.update(body)
    return body + h.digest()  # type: ignore[no-any-return]


# An array of a message: dtype code, shape, offset (in the arena), length.
ArraySpec = tuple[int, tuple[int, ...], int, int]
Buffer = bytes | bytearray | memoryview
# A header and its payload (metadata or an inline array; None: none), sent as two pieces.
Frame = tuple[bytes, Buffer | None]


def message_frames(
    key: bytes,
    op: int,
    lease: int,
    seq: int,
    arrays: Sequence[ArraySpec],
    inline: Sequence[Buffer] | None = None,
    offset: int = 0,
    meta: bytes | None = None,
) -> list[Frame]:
    """The frames of one message: the head frame (``offset``: on an INVOKE, the slot's
    base) with its metadata, then one frame per array: an SHM header when the payloads lie
    in the lease's arena (``inline`` None), else each header with its payload ``inline[i]``."""
    parts = len(arrays)
    length = 0 if meta is None else len(meta)
    frames: list[Frame] = [
        (pack(key, op, lease, seq, parts=parts, offset=offset, length=length), meta)
    ]
    flags = _SHM if inline is None else 0
    for part, (dtype, shape, at, size) in enumerate(arrays, start=1):
        head = pack(key, op, lease, seq, flags, dtype, part, parts, shape, at, size)
        frames.append((head, None if inline is None else inline[part - 1]))
    return frames


def pack_message(
    key: bytes, op: int, lease: int, seq: int, offset: int, meta: bytes, arrays: list[ArraySpec]
) -> bytes:
    """The frames of a message whose arrays lie in the lease's arena, joined: what a
    shared-memory ring entry holds."""
    frames = message_frames(key, op, lease, seq, arrays, offset=offset, meta=meta)
    return b"".join([chunk for frame in frames for chunk in frame if chunk is not None])


def unpack_arrays(
    data: bytes, pos: int, key: bytes, head: Header, max_length: int
) -> list[ArraySpec]:
    """The array frames of a ring entry: the ``head.parts`` headers at ``pos`` (after the
    head frame and its metadata), each checked as ``unpack`` checks one and as part of
    the message (same op, lease, seq and parts, in order, payload in the arena), with
    nothing after them. Any defect raises :class:`FrameError`."""
    keyed = _KEYED.get(key) or _keyed(key)
    op, lease, seq, parts = head.op, head.lease, head.seq, head.parts
    out: list[ArraySpec] = []
    for part in range(1, parts + 1):
        end = pos + HEADER_SIZE
        raw = data[pos:end]
        if len(raw) != HEADER_SIZE:
            raise FrameError("truncated ring entry")
        body = raw[:_BODY]
        h = keyed.copy()
        h.update(body)
        if not hmac.compare_digest(raw[_BODY:], h.digest()):
            raise FrameError("bad MAC" if raw[:4] == MAGIC else "bad magic")
        (magic, _, op_, flags, dtype, lease_, seq_, part_, parts_, ndim, d0, d1, d2, d3, at, n) = (
            _STRUCT.unpack(body)
        )
        if magic != MAGIC:
            raise FrameError("bad magic")
        if op_ != op or lease_ != lease or seq_ != seq or part_ != part or parts_ != parts:
            raise FrameError("array frame out of sequence")
        if flags != _SHM:
            raise FrameError("inline payload in a ring entry" if not flags else "unknown flags")
        itemsize = _ITEMSIZE.get(dtype)
        if itemsize is None:
            raise FrameError(f"unknown dtype {dtype}")
        shape = _shape(ndim, (d0, d1, d2, d3))
        if n > max_length:
            raise FrameError(f"payload length {n} exceeds limit {max_length}")
        _check_payload(shape, itemsize, n, max_length)
        out.append((dtype, shape, at, n))
        pos = end
    if pos != len(data):
        raise FrameError("truncated ring entry, or bytes after its frames")
    return out


# Keyed BLAKE2b states, one per key: copying one is cheaper than keying a new one.
_KEYED: dict[bytes, Any] = {}


def _keyed(key: bytes) -> Any:
    if len(_KEYED) >= 1024:  # keys are per session: forget old ones now and then
        _KEYED.clear()
    keyed = _KEYED[key] = hashlib.blake2b(key=key, digest_size=MAC_SIZE)
    return keyed


def mac(key: bytes, body: bytes) -> bytes:
    h = (_KEYED.get(key) or _keyed(key)).copy()
    h.update(body)
    return h.digest()  # type: ignore[no-any-return]


def session_key(token_mac: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hashlib.blake2b(
        client_nonce + server_nonce, key=token_mac[:64], digest_size=32, person=b"rgpu-session"
    ).digest()


_new = tuple.__new__  # builds a Header from its fields without the keyword machinery


def unpack(data: bytes | bytearray | memoryview, key: bytes, max_length: int) -> Header:
    """Parse and check one header; any defect raises :class:`FrameError`, nothing else."""
    if len(data) != HEADER_SIZE:
        raise FrameError(f"header is {len(data)} bytes, want {HEADER_SIZE}")
    raw = data if type(data) is bytes else bytes(data)
    body = raw[:_BODY]
    h = (_KEYED.get(key) or _keyed(key)).copy()
    h.update(body)
    if not hmac.compare_digest(raw[_BODY:], h.digest()):
        raise FrameError("bad MAC" if raw[:4] == MAGIC else "bad magic")
    (
        magic,
        version,
        op,
        flags,
        dtype,
        lease,
        seq,
        part,
        parts,
        ndim,
        d0,
        d1,
        d2,
        d3,
        offset,
        length,
    ) = _STRUCT.unpack(body)
    if magic != MAGIC:
        raise FrameError("bad magic")
    op_ = _OPS.get(op)
    dtype_ = _DTYPES.get(dtype)
    flags_ = _FLAGS.get(flags)
    if op_ is None:
        raise FrameError(f"unknown op {op}")
    if dtype_ is None:
        raise FrameError(f"unknown dtype {dtype}")
    if flags_ is None:
        raise FrameError(f"unknown flags {flags:#x}")
    shape = _shape(ndim, (d0, d1, d2, d3))
    if parts > MAX_PARTS or (part > parts and part != 0):
        raise FrameError(f"part {part} of {parts}")
    if length > max_length:
        raise FrameError(f"payload length {length} exceeds limit {max_length}")
    if part == 0:
        if dtype or ndim or flags:
            raise FrameError("a head frame carries no array")
        if length > MAX_META:
            raise FrameError(f"metadata of {length} bytes exceeds {MAX_META}")
    else:
        if not dtype:
            raise FrameError("an array frame needs a dtype")
        _check_payload(shape, _ITEMSIZE[dtype], length, max_length)
    return _new(
        Header, (op_, lease, seq, version, flags_, dtype_, part, parts, shape, offset, length)
    )


def place_array(
    h: Header, head: Header, part: int, lease: int, shm: bool, base: int, cursor: int, size: int
) -> int:
    """Where array frame ``h`` (number ``part`` of the INVOKE ``head``) lands in the
    request's slot ``[base, base + size)``: its own offset for an SHM frame, else
    ``cursor``, where the caller then reads the inline payload. A frame out of sequence,
    of the wrong kind for the lease or outside the slot raises :class:`Fatal`."""
    seq = head.seq
    if (h.op, h.seq, h.part, h.parts, h.lease) != (Op.INVOKE, seq, part, head.parts, lease):
        raise Fatal(Code.BAD_FRAME, "array frame out of sequence", seq)
    end = base + size
    if h.flags is Flags.SHM:  # identity: unpack gives one of two members, cheaper than &
        if not shm:
            raise Fatal(Code.BAD_FRAME, "SHM frame on a stream transport", seq)
        if not (base <= h.offset and h.offset + h.length <= end):
            raise Fatal(Code.MEMORY_QUOTA, "array lies outside the request's slot", seq)
        return h.offset
    if shm:
        raise Fatal(Code.BAD_FRAME, "inline payload on a shared-memory lease", seq)
    if cursor + h.length > end:
        raise Fatal(Code.MEMORY_QUOTA, f"arguments exceed the lease's {size}-byte slot", seq)
    return cursor
