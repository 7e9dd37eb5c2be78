"""The worker process of one lease: runs allow-listed functions on views of the arena.

Two ways requests reach it.

Direct (the fast path, TCP control channels): once the donor has authenticated the
client (HELLO: token, admission, the lease's uniqueness), it hands the connection's socket
to the worker over the pipe (``SCM_RIGHTS``), with the session: lease id, session key,
credits, quotas and whether payloads travel inline (TCP) or through the arena (shared
memory). From then on the client and the worker talk directly, in the same framed
protocol: every frame's MAC is checked with the session key, INVOKE head frames name the
slot (shared memory) and every array must lie inside its request's slot, the allow-list
and the rate quota are enforced here. For shared memory the connection is just the
doorbell: a request is a head frame and one small header per array, whose payload the
client wrote into the slot; the reply is the same, pointing into the slot. The worker
serves requests in order, so at most one slot is busy on its side; the client's credits
bound how many it has outstanding. On CLOSE, on a malformed frame (answered with ERROR)
or when the peer goes away, the worker tells the donor ``("closed",)``; the donor then
ends the lease (arena, admission, process). The donor can end it at any time by sending
None on the pipe.

Through the donor (other control channels, e.g. UCX, whose endpoint cannot be handed to
another process), over the pipe (pickled tuples):
  donor -> worker: ``(seq, slot, name, [(dtype, shape, offset, length), ...])`` or None to stop
  worker -> donor: ``("ok", seq, [(dtype, shape, offset, length), ...], seconds)``
                   ``("err", seq, code, message)``; first of all ``("ready",)``

Either way the worker reports its counters to the donor now and then as
``("stats", Stats)`` (the donor exports them). Results that are already views of the
request's slot are returned in place; others are copied into the slot after the inputs,
and must fit (the lease's memory quota).
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, Protocol

import numpy as np

from composable_dra.serving.token_bucket import TokenBucket
from remote_gpu import backends, idempotency
from remote_gpu.arena import Arena, align
from remote_gpu.errors import Code, FrameError
from remote_gpu.errors import Fatal as _Fatal
from remote_gpu.handshake import error_body
from remote_gpu.protocol import (
    HEADER_SIZE,
    MAX_META,
    ArraySpec,
    Flags,
    Header,
    Op,
    dtype_code,
    message_frames,
    numpy_dtype,
    pack_message,
    place_array,
    seq_after,
    unpack,
    unpack_arrays,
)
from remote_gpu.ring import Ring
from remote_gpu.transports import Frame, pieces
from remote_gpu.transports.tcp import Reader, send_all

STATS_INTERVAL = 0.25
_INVOKE, _RESULT = int(Op.INVOKE), int(Op.RESULT)  # ints: an enum member costs a lookup


@dataclass(frozen=True)
class Session:
    """What the donor tells the worker when it hands over an authenticated connection."""

    lease: int
    key: bytes = field(repr=False)
    credits: int
    shm: bool
    transport: str
    rate_limit: float = 0.0
    rate_burst: float = 16.0
    ring: bool = False
    spin: float = 0.0


@dataclass
class Stats:
    """Counters since the last report."""

    invocations: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, float]] = field(default_factory=list)  # (function, seconds)

    def __bool__(self) -> bool:
        return bool(self.invocations or self.bytes_in or self.bytes_out or self.errors)

    def error(self, code: Code) -> None:
        self.errors[code.value] = self.errors.get(code.value, 0) + 1


def resolve(path: str) -> Callable[..., Any]:
    """Import ``module:function`` (or ``module.function``)."""
    obj: Any = idempotency.resolve(path)
    if not callable(obj):
        raise TypeError(f"{path} is not callable")
    return obj  # type: ignore[no-any-return]


def _run_one(
    arena: Arena, fn: Callable[..., Any], slot: int, specs: Sequence[ArraySpec]
) -> list[ArraySpec]:
    args = [arena.array(off, dtype, shape) for dtype, shape, off, _ in specs]  # type: ignore[arg-type]
    out = fn(*args)
    results = out if isinstance(out, (tuple, list)) else (out,)
    replies: list[ArraySpec] = []
    free = -1  # where copied results go, after the inputs: worked out only when needed
    for r in results:
        for a, spec in zip(args, specs, strict=True):
            # An argument returned as it is (echo) lies where it was: nothing to check,
            # unless the function changed its shape or type in place.
            if r is a and a.shape == spec[1] and a.dtype == numpy_dtype(spec[0]):
                replies.append(spec)
                break
        else:
            base = arena.slot_base(slot)
            if free < 0:
                free = align(max((off + n for _, _, off, n in specs), default=base))
            free = _place(arena, r, base, base + arena.slot_size, free, replies)
    return replies


def _place(
    arena: Arena, r: object, base: int, end: int, free: int, replies: list[ArraySpec]
) -> int:
    """Add the reply of result ``r``: in place if it is a view of the slot, else copied
    into the slot at ``free``. Returns where the slot's free space now starts."""
    arr = np.asarray(r)
    code = int(dtype_code(arr.dtype))
    shape = tuple(int(d) for d in arr.shape)
    offset = arena.contains(arr, base, end)
    if offset is None:
        if free + arr.nbytes > end:
            raise MemoryError(
                f"results need more than the {arena.slot_size}-byte slot of this lease"
            )
        arena.buf[free : free + arr.nbytes] = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        offset = free
        free = align(free + arr.nbytes)
    replies.append((code, shape, offset, arr.nbytes))
    return free


def _call(
    arena: Arena,
    functions: dict[str, Callable[..., Any]],
    name: str,
    slot: int,
    specs: Sequence[ArraySpec],
) -> tuple[list[ArraySpec], float] | tuple[Code, str]:
    fn = functions.get(name)
    if fn is None:
        return Code.NOT_ALLOWED, f"{name!r} is not allowed"
    start = time.perf_counter()
    try:
        replies = _run_one(arena, fn, slot, specs)
    except MemoryError as exc:
        return Code.MEMORY_QUOTA, str(exc)
    except Exception as exc:
        return Code.FUNCTION_FAILED, f"{type(exc).__name__}: {exc}"
    return replies, time.perf_counter() - start


def result_frames(
    key: bytes, lease: int, seq: int, results: Sequence[ArraySpec], inline: Arena | None
) -> list[Frame]:
    """The RESULT message for arrays in the lease's arena: SHM frames, or with
    ``inline`` (a stream lease's arena) each payload inline."""
    payloads = None if inline is None else [inline.view(at, n) for _, _, at, n in results]
    return message_frames(key, Op.RESULT, lease, seq, results, payloads)


def error_frame(lease: int, seq: int, code: Code, message: str, key: bytes) -> Frame:
    meta = error_body(code.value, message)
    return (Header(Op.ERROR, lease, seq, length=len(meta)).pack(key), meta)


class _Source(Protocol):
    def read(self, n: int) -> bytes: ...

    def read_into(self, dst: memoryview) -> None: ...


class _NoStream:
    """The reader of a ring lease's server: its requests come whole, from the ring."""

    def read(self, n: int) -> bytes:
        raise _Fatal(Code.BAD_FRAME, "no stream on a ring lease")

    def read_into(self, dst: memoryview) -> None:
        raise _Fatal(Code.BAD_FRAME, "no stream on a ring lease")


@dataclass(eq=False)
class DirectServer:
    """Serves one lease's requests in this worker: from a handed-over connection
    (``reader`` over its socket, ``send`` writing to it) or from the lease's rings."""

    reader: _Source
    send: Callable[[Sequence[Frame]], None]
    arena: Arena
    functions: dict[str, Callable[..., Any]]
    session: Session
    ring: Ring | None = None
    stats: Stats = field(default_factory=Stats, init=False)
    bucket: TokenBucket = field(init=False)
    _limit: int = field(init=False)
    _last: int = field(default=0, init=False)  # the last request's sequence (``seq_after``)

    def __post_init__(self) -> None:
        self.bucket = TokenBucket(self.session.rate_limit, self.session.rate_burst)
        self._limit = max(self.arena.slot_size, MAX_META)

    def _sequence(self, seq: int) -> None:
        """Refuse a request that does not come after the previous one (a replay)."""
        if not seq_after(seq, self._last):
            raise _Fatal(Code.BAD_SEQUENCE, f"request {seq} after {self._last}", seq)
        self._last = seq

    def _header(self, limit: int) -> Header:
        raw = self.reader.read(HEADER_SIZE)
        try:
            return unpack(raw, self.session.key, limit)
        except FrameError as exc:
            raise _Fatal(Code.BAD_FRAME, str(exc)) from None

    def _meta(self, header: Header) -> bytes:
        return self.reader.read(header.length) if header.length else b""

    def step(self) -> bool:
        """Read and answer one message; False once the client has said CLOSE."""
        header = self._header(self._limit)
        if header.lease != self.session.lease:
            raise _Fatal(Code.BAD_FRAME, "frame for another lease", header.seq)
        if header.part != 0:
            raise _Fatal(Code.BAD_FRAME, "array frame outside a message", header.seq)
        if self.session.ring and header.op != Op.INVOKE:
            raise _Fatal(Code.BAD_FRAME, f"{header.op.name} in the request ring", header.seq)
        if header.op == Op.CLOSE:
            return False
        self._sequence(header.seq)
        if header.op == Op.HEARTBEAT:
            self._meta(header)
            self.send(
                [
                    (
                        Header(Op.HEARTBEAT, self.session.lease, header.seq).pack(self.session.key),
                        None,
                    )
                ]
            )
            return True
        if header.op != Op.INVOKE:
            raise _Fatal(Code.BAD_FRAME, f"unexpected {header.op.name}", header.seq)
        self._invoke(header)
        return True

    def _invoke(self, head: Header) -> None:
        seq, arena, shm = head.seq, self.arena, self.session.shm
        name = self._meta(head).decode("utf-8", "replace")
        if shm:
            found = arena.slot_of(head.offset)
            if found is None:
                raise _Fatal(Code.BAD_FRAME, "INVOKE names no slot of this lease", seq)
            slot = found
        else:
            slot = 0  # requests are served in order: one slot at a time is busy
        base = arena.slot_base(slot)
        cursor = base
        specs: list[ArraySpec] = []
        for part in range(1, head.parts + 1):
            h = self._header(arena.slot_size)
            offset = place_array(
                h, head, part, self.session.lease, shm, base, cursor, arena.slot_size
            )
            if h.flags is not Flags.SHM:
                self.reader.read_into(arena.view(offset, h.length))
                cursor = align(offset + h.length)
            specs.append((int(h.dtype), h.shape, offset, h.length))
        self._execute(seq, name, slot, specs)

    def ring_step(self, data: bytes) -> None:
        """Answer one request taken from the ring: the checks of ``step`` on the frames
        of one entry, whose arrays must lie in the slot the head frame names."""
        s, arena = self.session, self.arena
        key, size = s.key, arena.slot_size
        try:
            head = unpack(data[:HEADER_SIZE], key, self._limit)
        except FrameError as exc:
            raise _Fatal(Code.BAD_FRAME, str(exc)) from None
        seq = head.seq
        if head.lease != s.lease:
            raise _Fatal(Code.BAD_FRAME, "frame for another lease", seq)
        if head.part != 0:
            raise _Fatal(Code.BAD_FRAME, "array frame outside a message", seq)
        if head.op != _INVOKE:
            raise _Fatal(Code.BAD_FRAME, f"{head.op.name} in the request ring", seq)
        self._sequence(seq)
        slot = arena.slot_of(head.offset)
        if slot is None:
            raise _Fatal(Code.BAD_FRAME, "INVOKE names no slot of this lease", seq)
        pos = HEADER_SIZE + head.length
        name = data[HEADER_SIZE:pos].decode("utf-8", "replace")
        try:
            specs = unpack_arrays(data, pos, key, head, size)
        except FrameError as exc:
            raise _Fatal(Code.BAD_FRAME, str(exc), seq) from None
        base = slot * size
        end = base + size
        for _, _, at, n in specs:
            if not (base <= at and at + n <= end):
                raise _Fatal(Code.MEMORY_QUOTA, "array lies outside the request's slot", seq)
        self._execute(seq, name, slot, specs)

    def _execute(self, seq: int, name: str, slot: int, specs: list[ArraySpec]) -> None:
        """Run a checked request (allow-list, rate quota) and send its answer."""
        self.stats.bytes_in += sum(s[3] for s in specs)
        if name not in self.functions:
            self._refuse(seq, Code.NOT_ALLOWED, f"{name!r} is not on this donor's allow-list")
            return
        if not self.bucket.take():
            self._refuse(seq, Code.RATE_LIMITED, f"lease exceeds {self.session.rate_limit}/s")
            return
        outcome = _call(self.arena, self.functions, name, slot, specs)
        if isinstance(outcome[0], Code):
            code, message = outcome
            self._refuse(seq, code, str(message))
            return
        results, seconds = outcome
        self.stats.invocations += 1
        self.stats.calls.append((name, seconds))
        if self.ring is not None:
            self.stats.bytes_out += sum(r[3] for r in results)
            self.ring.post(
                pack_message(self.session.key, _RESULT, self.session.lease, seq, 0, b"", results)
            )
        else:
            self.send(self._result_frames(seq, results))

    def _refuse(self, seq: int, code: Code, message: str) -> None:
        self.stats.error(code)
        self.send([error_frame(self.session.lease, seq, code, message, self.session.key)])

    def _result_frames(self, seq: int, results: Sequence[ArraySpec]) -> list[Frame]:
        self.stats.bytes_out += sum(r[3] for r in results)
        inline = None if self.session.shm else self.arena
        return result_frames(self.session.key, self.session.lease, seq, results, inline)

    def fail(self, exc: _Fatal) -> None:
        """Answer a fatal defect with ERROR (best effort); the connection then ends."""
        self.stats.error(exc.code)
        with contextlib.suppress(OSError, FrameError):
            self.send(
                [error_frame(self.session.lease, exc.seq, exc.code, exc.message, self.session.key)]
            )


def _report(conn: Connection, stats: Stats) -> Stats:
    if stats:
        with contextlib.suppress(OSError):  # the donor has gone: nobody to tell
            conn.send(("stats", stats))
        return Stats()
    return stats


def _reported(conn: Connection, server: DirectServer, last: float) -> float:
    """Send the server's stats once ``STATS_INTERVAL`` has passed since ``last``; the time
    of the latest report."""
    now = time.monotonic()
    if now - last < STATS_INTERVAL:
        return last
    server.stats = _report(conn, server.stats)
    return now


def _stop_asked(conn: Connection) -> bool:
    """Read the donor's message on the pipe: None (or the pipe gone) asks to stop."""
    try:
        return conn.recv() is None
    except (EOFError, OSError):
        return True


@dataclass(frozen=True)
class _Worker:
    """What every lease this worker serves shares: the donor's pipe, the arena, the functions."""

    conn: Connection
    arena: Arena
    functions: dict[str, Callable[..., Any]]

    def server(
        self,
        reader: _Source,
        send: Callable[[Sequence[Frame]], None],
        session: Session,
        ring: Ring | None = None,
    ) -> DirectServer:
        return DirectServer(reader, send, self.arena, self.functions, session, ring)


def _serve_direct(worker: _Worker, session: Session) -> bool:
    """Serve the handed-over connection; True if the donor asked to stop meanwhile."""
    conn = worker.conn
    fd = reduction.recv_handle(conn)
    sock = socket.socket(fileno=fd)
    sock.setblocking(True)
    reader = Reader(sock)
    server = worker.server(reader, lambda frames: send_all(sock, frames), session)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(conn.fileno(), select.POLLIN)
    sock_fd = sock.fileno()
    stop = False
    last = time.monotonic()
    try:
        while True:
            # Here already, or came while we watched: a sequential caller's next request
            # usually does, and then costs neither side a wake-up. Without a spin, straight
            # to poll: a read tried first fails (EAGAIN) on nearly every sequential call.
            if reader.buffered() or (session.spin > 0 and reader.spin(session.spin)):
                events = [(sock_fd, select.POLLIN)]
            else:
                events = poller.poll(int(STATS_INTERVAL * 1000))
            if any(fd != sock_fd for fd, _ in events) and _stop_asked(conn):
                stop = True
                break
            if events:
                try:
                    if not server.step():
                        break
                except _Fatal as exc:
                    server.fail(exc)
                    break
                except (ConnectionError, OSError):
                    break
            last = _reported(conn, server, last)
    finally:
        sock.close()
        _report(conn, server.stats)
    return stop


def _serve_ring(worker: _Worker, session: Session) -> None:
    """Serve the lease's request ring until the donor says stop (None on the pipe).

    A defect in the ring is reported to the donor as ``("fatal", code, message, seq)``
    (it answers on the control channel and ends the lease); the worker then serves no
    more requests."""
    conn = worker.conn
    ring = Ring(worker.arena, session.credits, "worker")

    def send(frames: Sequence[Frame]) -> None:
        ring.post(b"".join(pieces(frames)))

    server = worker.server(_NoStream(), send, session, ring)
    pipe = conn.fileno()
    serving = True
    last = time.monotonic()
    try:
        while True:
            if serving and ring.ready():
                try:
                    server.ring_step(ring.take())
                except (_Fatal, FrameError) as exc:
                    fatal = exc if isinstance(exc, _Fatal) else _Fatal(Code.BAD_FRAME, str(exc))
                    server.stats.error(fatal.code)
                    conn.send(("fatal", fatal.code.value, fatal.message, fatal.seq))
                    serving = False
            elif (
                not serving or ring.wait(STATS_INTERVAL, pipe, spin=session.spin)
            ) and _stop_asked(conn):
                return
            last = _reported(conn, server, last)
    finally:
        _report(conn, server.stats)
        ring.close()


def main(
    conn: Connection,
    arena_path: str,
    size: int,
    slots: int,
    slot_size: int,
    allow: dict[str, str],
) -> None:
    arena = Arena.attach(arena_path, size, slots, slot_size)
    functions: dict[str, Callable[..., Any]] = {}
    gpu = backends.from_env()  # on the node's GPU where there is one (per function)
    for name, path in allow.items():
        functions[name] = backends.place(path, resolve(path), gpu)
    worker = _Worker(conn, arena, functions)
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        if msg[0] == "ring":
            _serve_ring(worker, msg[1])
            break
        if msg[0] == "serve":
            stopped = _serve_direct(worker, msg[1])
            if stopped:
                break
            conn.send(("closed",))
            continue
        seq, slot, name, specs = msg
        outcome = _call(arena, functions, name, slot, specs)
        if isinstance(outcome[0], Code):
            conn.send(("err", seq, outcome[0].value, outcome[1]))
        else:
            conn.send(("ok", seq, outcome[0], outcome[1]))
    # The lease is over, and its donor may be gone (killed): leave nothing in /dev/shm.
    arena.owner = True
    arena.close()
