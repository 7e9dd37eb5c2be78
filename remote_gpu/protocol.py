"""The framed binary protocol.

Every frame starts with a fixed 76-byte little-endian header::

    offset size field
    0      4    magic      b"RGPU"
    4      1    version    protocol version (HELLO: the sender's highest)
    5      1    op         HELLO, INVOKE, RESULT, ERROR, HEARTBEAT, CLOSE
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

A message is a head frame (part 0) whose payload is small metadata (JSON for HELLO and
ERROR, the function name for INVOKE, empty otherwise) followed by ``parts`` array frames.
Until HELLO completes the MAC key is a fixed public constant (integrity against corruption
only); afterwards both sides use a session key derived from the lease token's MAC and two
nonces, so a frame cannot be forged or replayed into another session without the token.
The MAC covers the header, which includes the payload length; payload bytes themselves
are not MACed (that would cost more than the transfer on fast links).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from enum import IntEnum, IntFlag
from typing import NamedTuple

import numpy as np

from remote_gpu.errors import FrameError

MAGIC = b"RGPU"
VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
MAX_NDIM = 4
MAX_PARTS = 64
MAX_META = 64 * 1024
MAC_SIZE = 16
HELLO_KEY = b"remote-gpu/hello/v1"

_STRUCT = struct.Struct("<4sBBBBQIHHB3x4IQQ")
HEADER_SIZE = _STRUCT.size + MAC_SIZE
assert HEADER_SIZE == 76


class Op(IntEnum):
    HELLO = 1
    INVOKE = 2
    RESULT = 3
    ERROR = 4
    HEARTBEAT = 5
    CLOSE = 6


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


_NUMPY: dict[DType, np.dtype[np.generic]] = {
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
_CODES: dict[np.dtype[np.generic], DType] = {v: k for k, v in _NUMPY.items()}
_ITEMSIZE: dict[int, int] = {int(k): v.itemsize for k, v in _NUMPY.items()}
# Plain lookups instead of enum construction: the parser runs once per frame.
_OPS: dict[int, Op] = {int(o): o for o in Op}
_DTYPES: dict[int, DType] = {int(d): d for d in DType}
_FLAGS: dict[int, Flags] = {0: Flags.NONE, 1: Flags.SHM}


def dtype_code(dtype: np.dtype[np.generic]) -> DType:
    code = _CODES.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    if code is None or dtype.byteorder == ">":
        raise FrameError(f"unsupported dtype {dtype}")
    return code


def numpy_dtype(code: DType) -> np.dtype[np.generic]:
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
        if len(self.shape) > MAX_NDIM or any(not 0 <= d < 2**32 for d in self.shape):
            raise FrameError(f"shape {self.shape} does not fit the header")
        dims = (*self.shape, 0, 0, 0, 0)[:MAX_NDIM]
        body = _STRUCT.pack(
            MAGIC,
            self.version,
            self.op,
            self.flags,
            self.dtype,
            self.lease,
            self.seq,
            self.part,
            self.parts,
            len(self.shape),
            *dims,
            self.offset,
            self.length,
        )
        return body + mac(key, body)

    @property
    def nbytes_expected(self) -> int:
        """Payload size implied by dtype and shape (array frames only)."""
        return math.prod(self.shape) * _ITEMSIZE[self.dtype]


def mac(key: bytes, body: bytes) -> bytes:
    return hashlib.blake2b(body, key=key, digest_size=MAC_SIZE).digest()


def session_key(token_mac: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hashlib.blake2b(
        client_nonce + server_nonce, key=token_mac[:64], digest_size=32, person=b"rgpu-session"
    ).digest()


def unpack(data: bytes | bytearray | memoryview, key: bytes, max_length: int) -> Header:
    """Parse and check one header; any defect raises :class:`FrameError`, nothing else."""
    if len(data) != HEADER_SIZE:
        raise FrameError(f"header is {len(data)} bytes, want {HEADER_SIZE}")
    raw = bytes(data)
    body, tag = raw[:-MAC_SIZE], raw[-MAC_SIZE:]
    if not hmac.compare_digest(tag, mac(key, body)):
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
    if ndim > MAX_NDIM:
        raise FrameError(f"ndim {ndim} > {MAX_NDIM}")
    dims = (d0, d1, d2, d3)
    if any(dims[ndim:]):
        raise FrameError("shape has dimensions beyond ndim")
    if parts > MAX_PARTS or (part > parts and part != 0):
        raise FrameError(f"part {part} of {parts}")
    if length > max_length:
        raise FrameError(f"payload length {length} exceeds limit {max_length}")
    header = Header(
        op=op_,
        lease=lease,
        seq=seq,
        version=version,
        flags=flags_,
        dtype=dtype_,
        part=part,
        parts=parts,
        shape=dims[:ndim],
        offset=offset,
        length=length,
    )
    if part == 0:
        if dtype_ != DType.NONE or ndim or flags_:
            raise FrameError("a head frame carries no array")
        if length > MAX_META:
            raise FrameError(f"metadata of {length} bytes exceeds {MAX_META}")
    else:
        if dtype_ == DType.NONE:
            raise FrameError("an array frame needs a dtype")
        if header.nbytes_expected != length:
            raise FrameError(f"length {length} does not match dtype and shape")
    return header
