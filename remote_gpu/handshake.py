"""The handshake's messages: CHALLENGE, HELLO, the donor's reply, and ERROR bodies.

The wire format is described in ``remote_gpu.protocol``. Every message read here comes
from a peer that has proven nothing yet, so parsing is bounded (size, JSON nesting,
numbers: ``pydantic`` parses strictly, refuses unknown fields, non-finite numbers and
deep nesting) and any defect is a :class:`FrameError` (or :class:`AuthError` for a proof
that does not verify), never anything else. Errors name the field, never echo its value.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from remote_gpu.errors import AuthError, FrameError, RemoteGPUError, from_code
from remote_gpu.protocol import HELLO_KEY, MAX_META, Header, Op

NONCE_SIZE = 16
PROOF_SIZE = 32
MAX_HELLO = 4096  # bytes of a HELLO's metadata: a few hundred when well-formed
_BODY = 60  # the header's bytes a proof covers (all but its MAC)

Nonce = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
Name = Annotated[str, StringConstraints(max_length=253)]
Versions = Annotated[list[Annotated[int, Field(ge=0, le=255)]], Field(min_length=1, max_length=16)]


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class Challenge(_Message):
    versions: Versions
    nonce: Nonce


class Hello(_Message):
    versions: Versions
    lease: int = Field(ge=0, lt=1 << 64)
    donor: Name
    expiry: float = Field(ge=0, le=1e12)
    nonce: Nonce
    transport: Literal["auto", "shm", "tcp", "ucx"] = "auto"
    host: Annotated[str, StringConstraints(max_length=256)] = ""
    credits: int = Field(default=4, ge=1, le=1024)
    frame_bytes: int = Field(default=0, ge=0, le=1 << 40)
    target_rate: float = Field(default=0.0, ge=0, le=1e9)
    ring: bool = False


class RingInfo(_Message):
    entries: int = Field(ge=1, le=1024)


class Accept(_Message):
    version: int = Field(ge=0, le=255)
    donor: Name
    credits: int = Field(ge=1, le=1024)
    transport: Literal["shm", "tcp", "ucx"]
    slot_size: int = Field(ge=1, le=1 << 40)
    functions: Annotated[list[Name], Field(max_length=1024)] = []
    # The functions declared idempotent (``remote_gpu.idempotency``): the client may run
    # a call of one again after its connection was lost.
    # None (left out of the reply) at version 2.
    idempotent: Annotated[list[Name], Field(max_length=1024)] | None = None
    arena: Annotated[str, StringConstraints(max_length=64)] | None = None
    arena_size: int | None = Field(default=None, ge=1, le=1 << 44)
    ring: RingInfo | None = None


class ErrorBody(_Message):
    code: Annotated[str, StringConstraints(max_length=64)]
    message: Annotated[str, StringConstraints(max_length=4096)]


M = TypeVar("M", bound=_Message)


def _parse(model: type[M], data: bytes) -> M:
    if len(data) > MAX_META:
        raise FrameError(f"{model.__name__} of {len(data)} bytes exceeds {MAX_META}")
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "message"
        raise FrameError(f"malformed {model.__name__}: {where}: {first['type']}") from None


Frame = tuple[bytes, bytes]  # header, metadata: sent as two pieces (UCX keeps boundaries)


def _frame(op: Op, lease: int, version: int, body: bytes, prove: Any = None) -> Frame:
    """A handshake frame; ``prove(header_body, body)`` gives the proof appended to the
    metadata, if any."""
    length = len(body) + (PROOF_SIZE if prove else 0)
    header = Header(op, lease, 0, version=version, length=length).pack(HELLO_KEY)
    proof = prove(header[:_BODY], body) if prove else b""
    return header, body + proof


def _split(meta: bytes) -> tuple[bytes, bytes]:
    if len(meta) <= PROOF_SIZE:
        raise FrameError("handshake message without its proof")
    return meta[:-PROOF_SIZE], meta[-PROOF_SIZE:]


def _prove(key: bytes, person: bytes, nonce: bytes, header_body: bytes, body: bytes) -> bytes:
    h = hashlib.blake2b(key=key[:64], digest_size=PROOF_SIZE, person=person)
    h.update(nonce)
    h.update(header_body)
    h.update(body)
    return h.digest()


def _check_head(header: Header, op: Op) -> None:
    if header.op != op or header.parts or header.part:
        raise FrameError(f"expected {op.name}, got {header.op.name}")


# ---- CHALLENGE (donor -> client)


def challenge_frame(versions: list[int], nonce: bytes) -> Frame:
    body = json.dumps({"versions": versions, "nonce": nonce.hex()}).encode()
    return _frame(Op.CHALLENGE, 0, max(versions), body)


def parse_challenge(header: Header, meta: bytes) -> tuple[Challenge, bytes]:
    """The challenge and its nonce; raises the donor's error if it sent ERROR instead."""
    if header.op == Op.ERROR:
        raise parse_error(meta)
    _check_head(header, Op.CHALLENGE)
    challenge = _parse(Challenge, meta)
    return challenge, bytes.fromhex(challenge.nonce)


# ---- HELLO (client -> donor)


def hello_frame(hello: Hello, secret: bytes, server_nonce: bytes) -> Frame:
    """The HELLO with its proof of possession of ``secret`` (the token's MAC)."""
    body = hello.model_dump_json().encode()

    def prove(header_body: bytes, data: bytes) -> bytes:
        return _prove(secret, b"rgpu-hello", server_nonce, header_body, data)

    return _frame(Op.HELLO, hello.lease, max(hello.versions), body, prove)


def parse_hello(header: Header, raw_header: bytes, meta: bytes) -> tuple[Hello, bytes, bytes]:
    """The HELLO's claims, the bytes its proof covers after the nonce, and the proof."""
    _check_head(header, Op.HELLO)
    body, proof = _split(meta)
    hello = _parse(Hello, body)
    if hello.lease != header.lease:
        raise FrameError("the HELLO's frame and body name different leases")
    return hello, raw_header[:_BODY] + body, proof


def check_hello_proof(secret: bytes, server_nonce: bytes, covered: bytes, proof: bytes) -> None:
    want = _prove(secret, b"rgpu-hello", server_nonce, covered[:_BODY], covered[_BODY:])
    if not hmac.compare_digest(want, proof):
        raise AuthError("proof of possession of the token does not verify")


# ---- the donor's reply (donor -> client)


def accept_frame(accept: Accept, lease: int, session_key: bytes, client_nonce: bytes) -> Frame:
    body = accept.model_dump_json(exclude_none=True).encode()

    def prove(header_body: bytes, data: bytes) -> bytes:
        return _prove(session_key, b"rgpu-accept", client_nonce, header_body, data)

    return _frame(Op.HELLO, lease, accept.version, body, prove)


def parse_accept(
    header: Header, raw_header: bytes, meta: bytes, session_key: bytes, client_nonce: bytes
) -> Accept:
    """The donor's reply, once its proof verifies with the session key; raises the
    donor's error if it sent ERROR instead."""
    if header.op == Op.ERROR:
        raise parse_error(meta)
    _check_head(header, Op.HELLO)
    body, proof = _split(meta)
    want = _prove(session_key, b"rgpu-accept", client_nonce, raw_header[:_BODY], body)
    if not hmac.compare_digest(want, proof):
        raise AuthError("the donor's reply does not prove the session key")
    accept = _parse(Accept, body)
    if accept.transport == "shm" and (accept.arena is None or accept.arena_size is None):
        raise FrameError("a shared-memory reply names no arena")
    if accept.ring is not None and accept.ring.entries != accept.credits:
        raise FrameError("ring entries and credits differ")
    return accept


# ---- ERROR bodies (either direction, any time)


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"code": code, "message": message[:2000]}).encode()


def parse_error(meta: bytes) -> RemoteGPUError:
    """The typed error an ERROR frame's body reports (a FrameError if it is malformed)."""
    try:
        body = _parse(ErrorBody, meta)
    except FrameError as exc:
        return exc
    return from_code(body.code, body.message)
