"""The client library: :class:`RemoteGPU`.

``RemoteGPU.from_env()`` reads what the CDI spec injects into the pod (the names:
``composable_dra.model.remote_env``): ``REMOTE_GPU_ENDPOINT`` (``host:port``, or
``ucx://host:port``), ``REMOTE_GPU_TOKEN_FILE``, optionally ``REMOTE_GPU_LEASE`` (checked
against the token) and ``REMOTE_GPU_TRANSPORT`` (``auto``, ``shm``, ``tcp`` or ``ucx``).
``RemoteGPU.all_from_env()`` opens every lease of a claim for several remote GPUs
(``REMOTE_GPUS``, ``REMOTE_GPU_<i>_*``); ``remote_gpu.pool.RemoteGPUPool`` spreads calls
over them. ``invoke(name, *arrays)`` runs an allow-listed function on the donor and
returns its result arrays; ``submit`` does the same without
waiting, up to the credits the donor granted.

Replies are read by the calling threads themselves, not by a background thread: whoever
waits (``Future.result``/``exception``/``done`` on a returned future, ``invoke``,
``submit`` waiting for a credit, ``heartbeat``, ``drain``) takes the connection's read
lock, reads one reply, completes whichever future it belongs to, and lets go. This saves
two thread hand-offs per call; the cost is that a future completes only while some thread
waits on this client: ``concurrent.futures.wait`` and done-callbacks alone do not drive
it (call ``drain()``). No wait is endless: without a timeout of its own, each lasts at most
the client's ``timeout``, then raises :class:`DeadlineExceeded` (a ``TimeoutError``), as
does a donor that stops sending in the middle of a reply or stops reading requests. On a
stream transport (TCP, UCX), the first payload of ``LARGE``
bytes or more starts a receiver thread that reads from then on, so that large transfers
go both ways at once; ``receiver=True``/``False`` fixes the choice.

With shared memory, results are views of the lease's arena by default (no copy), as
long as views leave a slot free (they pin at most ``credits - 1`` slots); past that they
are copies, so that holding any number of results never stalls the calls that follow. A
slot stays out of use while any view of it (or of a view of it) is alive: the reference
count of the slot's pin, which every view leads back to, says so. ``views=True`` always
returns views (a caller may then hold at most ``credits`` results at a time; a call waits
for one to be dropped, TimeoutError after ``timeout``), and ``views=False`` always
copies. The lease's worker writes into a slot only while it serves a request there, and
a slot that views pin gets no request.

On the rings a call costs no system call while the worker is busy or spinning (see
``ring``), and a caller waiting for a reply watches the ring for ``spin`` seconds
(yielding its CPU between looks) before it sleeps on the doorbell; ``submit`` first
reads the replies that are there already; and the client adds up its calls, bytes and
latencies and hands them to the metrics every ``METRICS_INTERVAL`` seconds or 256 calls,
and on ``close`` (a metric update takes a lock).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import os
import secrets
import select
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from composable_dra.model import remote_env
from composable_dra.process import logs
from remote_gpu import handshake, metrics
from remote_gpu.arena import ALIGN, PAGE, SEAL_SIZE, Arena, align
from remote_gpu.errors import (
    DeadlineExceeded,
    FrameError,
    MemoryQuotaExceeded,
    RemoteGPUError,
    VersionError,
)
from remote_gpu.protocol import (
    HEADER_SIZE,
    HELLO_KEY,
    MAX_META,
    SUPPORTED_VERSIONS,
    ArraySpec,
    DType,
    Flags,
    Header,
    Op,
    dtype_code,
    message_frames,
    numpy_dtype,
    pack_message,
    session_key,
    unpack,
    unpack_arrays,
)
from remote_gpu.ring import Ring, ctl_size
from remote_gpu.spares import Spares
from remote_gpu.tokens import Token, read
from remote_gpu.transports import ClientTransport, Frame, host_id

log = logs.get(__name__)

Result = tuple[np.ndarray, ...]

LARGE = 4 << 20
_INVOKE, _RESULT = int(Op.INVOKE), int(Op.RESULT)  # ints: an enum member costs a lookup
METRICS_INTERVAL = 0.25
# How long (seconds) a caller waiting for a reply watches the ring, or the TCP socket,
# before it sleeps (yielding its CPU between looks: ``Ring.wait``, ``tcp.Reader.spin``).
SPIN = 250e-6


def lease_files(directory: Path) -> tuple[str, Token]:
    """(endpoint, token) from a lease's directory (``composable_dra.model.remote_env``);
    RemoteGPUError while the two do not name one lease (the plugin is replacing them)."""
    try:
        raw = (directory / remote_env.ENDPOINT).read_bytes()[:8192]
    except OSError as exc:
        raise RemoteGPUError(f"cannot read the lease's endpoint: {exc.strerror}") from None
    try:
        endpoint, lease = remote_env.read_endpoint_file(raw)
    except remote_env.RemoteEnvError as exc:
        raise RemoteGPUError(str(exc)) from None
    token = read(directory / remote_env.TOKEN)
    if token.lease != lease:
        raise RemoteGPUError("the lease's endpoint and token name different leases")
    return endpoint, token


def env_leases(env: Mapping[str, str]) -> list[remote_env.LeaseVars]:
    """The variable names of each lease ``env`` describes, in index order."""
    try:
        found = remote_env.indexes(env)
    except remote_env.RemoteEnvError as exc:
        raise RemoteGPUError(str(exc)) from None
    if not found:
        raise RemoteGPUError(f"{remote_env.LIST} and REMOTE_GPU_ENDPOINT are not set")
    return [remote_env.names(i) for i in found]


class _Closes(Protocol):
    def close(self) -> None: ...


_G = TypeVar("_G", bound=_Closes)


def open_each(open_one: Callable[[remote_env.LeaseVars], _G], leases: list[Any]) -> list[_G]:
    """``open_one`` of each lease; those opened are closed again when one fails."""
    opened: list[_G] = []
    try:
        for names in leases:
            opened.append(open_one(names))
    except BaseException:
        for gpu in opened:
            gpu.close()
        raise
    return opened


def _connect(endpoint: str, timeout: float) -> ClientTransport:
    if endpoint.startswith("ucx://"):
        from remote_gpu.transports.ucx import UcxClientTransport

        host, _, port = endpoint.removeprefix("ucx://").rpartition(":")
        ucx: ClientTransport = UcxClientTransport(host.strip("[]"), int(port), timeout)
        return ucx
    from remote_gpu.transports.tcp import TcpClientTransport

    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return TcpClientTransport(host.strip("[]"), int(port), timeout)


def _bytes_of(a: np.ndarray) -> memoryview:
    """A writable byte view of a C-contiguous array."""
    return memoryview(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]


class _Call(Future[tuple[np.ndarray, ...]]):
    """A pending invocation; without a receiver thread, waiting for it drives the client's
    connection. ``_over`` is set once it has completed (a cheap check, no lock)."""

    def __init__(self, client: RemoteGPU) -> None:
        super().__init__()
        self._client = client
        self._over = False

    def _finished(self) -> bool:
        return self._over  # a waiter asks often: Future.done would take its lock each time

    def cancel(self) -> bool:
        cancelled = super().cancel()
        if cancelled:
            self._over = True
        return cancelled

    def set_result(self, result: tuple[np.ndarray, ...]) -> None:
        super().set_result(result)
        self._over = True

    def set_exception(self, exception: BaseException | None) -> None:
        super().set_exception(exception)
        self._over = True

    # Without a ``timeout``, a wait lasts at most the client's: no wait is endless.

    def result(self, timeout: float | None = None) -> tuple[np.ndarray, ...]:
        if self._client._receiver is not None:
            self._wait(timeout)
        elif not self._over:
            self._client._await(self, self._client.timeout if timeout is None else timeout)
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._client._receiver is not None:
            self._wait(timeout)
        elif not self._over:
            self._client._await(self, self._client.timeout if timeout is None else timeout)
        return super().exception(0)

    def _wait(self, timeout: float | None) -> None:
        """Wait for the receiver thread to complete this call."""
        wait = self._client.timeout if timeout is None else timeout
        if not concurrent.futures.wait([self], wait).done:
            raise DeadlineExceeded("no reply from the donor in time")

    def done(self) -> bool:
        if not self._finished() and self._client._receiver is None:
            self._client._progress(self._finished, 0.0, quiet=True)
        return super().done()


class _Source(Protocol):
    def recv_header(self) -> bytes | bytearray: ...

    def recv_payload_into(self, view: memoryview) -> None: ...


class _Entry:
    """A response taken from the ring, read like a stream of frames."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def recv_header(self) -> bytes:
        return self._take(HEADER_SIZE)

    def recv_payload_into(self, view: memoryview) -> None:
        view[:] = self._take(len(view))

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise FrameError("truncated ring entry")
        self.pos += n
        return self.data[self.pos - n : self.pos]


class _Pin(np.ndarray):
    """All of one arena slot. Result views are slices of it: while one is alive, so is a
    reference to the pin, and the slot is not used again."""


class RemoteGPU:
    def __init__(
        self,
        endpoint: str,
        token: Token,
        *,
        transport: str = "auto",
        credits: int = 4,
        frame_bytes: int = 0,
        target_rate: float = 0.0,
        versions: tuple[int, ...] = tuple(sorted(SUPPORTED_VERSIONS)),
        timeout: float = 30.0,
        views: bool | None = None,
        receiver: bool | None = None,
        spin: float = SPIN,
    ) -> None:
        self.lease = token.lease
        self.timeout = timeout
        self.spin = spin
        self.views = views
        self._tr = _connect(endpoint, timeout)
        self._seq = itertools.count(1)
        self._send_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._slot_lock = threading.Lock()
        self._pending: dict[int, tuple[Future[Result], float, int]] = {}
        self._closed = False
        self._failure: BaseException | None = None
        self.arena: Arena | None = None
        self._ring: Ring | None = None
        self._changed = threading.Condition()
        self._receiver: threading.Thread | None = None
        try:
            self._hello(token, transport, credits, frame_bytes, target_rate, versions)
        except BaseException:
            self._tr.close()
            if self._ring is not None:
                self._ring.close()
            if self.arena is not None:
                self.arena.close()
            raise
        # One token per credit; with shared memory it is also the slot the request uses.
        self._free: list[int] = list(range(self.credits))
        # Shared memory: how many slots result views may pin (see the module docstring),
        # the slots that results were handed out of as views, and the pins themselves.
        self._max_pins = (
            0
            if self.arena is None or views is False
            else self.credits
            if views
            else self.credits - 1
        )
        self._viewed: list[int] = []
        self._pins: list[_Pin] = []
        # Buffers for large copied results, reused once dropped: at most the lease's quota.
        self._spares = Spares(self.credits)
        self._unpinned = 0
        self._mem = memoryview(b"")
        if self.arena is not None:
            self._mem = memoryview(self.arena.buf)
            size = self.slot_size
            self._pins = [
                self.arena.buf[i * size : (i + 1) * size].view(_Pin) for i in range(self.credits)
            ]
            self._unpinned = sys.getrefcount(self._pins[0])  # the list's and the argument's
        self._m_out = metrics.BYTES.labels("client", "out", self.transport)
        self._m_in = metrics.BYTES.labels("client", "in", self.transport)
        self._m_latency = metrics.LATENCY.labels("client")
        self._m_calls = metrics.INVOCATIONS.labels("client")
        # Calls, latencies and bytes are noted here and added to the metrics every
        # METRICS_INTERVAL seconds or 256 calls and on close: a metric update costs a lock.
        self._out = self._in = 0
        self._latencies: list[float] = []
        self._flush_at = 0.0
        # Callers read their own replies: no thread hand-off per call. On a stream
        # transport, the first payload of LARGE bytes or more starts a receiver thread
        # instead: a single thread alternates between sending and receiving, while
        # large transfers should go both ways at once (socket calls let go of the GIL).
        self._auto_receiver = receiver is None and self._ring is None
        if receiver:
            self._start_receiver()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> RemoteGPU:
        """The container's (first) lease: the unsuffixed variables."""
        env = os.environ if env is None else env
        return cls._from_vars(env, remote_env.names(None), **kwargs)

    @classmethod
    def all_from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> list[RemoteGPU]:
        """Every lease the container's claim gave it (``REMOTE_GPUS``), opened in index
        order; one lease where only the unsuffixed variables are set. None opened stays
        open when one fails."""
        env = os.environ if env is None else env
        return open_each(lambda names: cls._from_vars(env, names, **kwargs), env_leases(env))

    @classmethod
    def _from_vars(
        cls, env: Mapping[str, str], names: remote_env.LeaseVars, **kwargs: Any
    ) -> RemoteGPU:
        """The lease the variables ``names`` describe: from its directory where the plugin
        gave one (its files are current: a re-opened lease is written there), else from
        the endpoint and token file variables."""
        kwargs.setdefault("transport", env.get("REMOTE_GPU_TRANSPORT", "auto"))
        directory = env.get(names.directory)
        if directory:
            endpoint, token = lease_files(Path(directory))
            return cls(endpoint, token, **kwargs)
        try:
            endpoint = env[names.endpoint]
            token_path = Path(env[names.token_file])
        except KeyError as exc:
            raise RemoteGPUError(f"{exc.args[0]} is not set") from None
        token = read(token_path)
        lease = env.get(names.lease)
        if lease is not None and int(lease) != token.lease:
            raise RemoteGPUError(f"{names.lease} does not match the token's lease")
        return cls(endpoint, token, **kwargs)

    @property
    def failed(self) -> bool:
        """The connection is lost (the donor closed it or went away), not closed here:
        every later call fails; a new connection is needed."""
        return self._failure is not None and not self._closed

    # ---- handshake

    def _hello(
        self,
        token: Token,
        transport: str,
        credits: int,
        frame_bytes: int,
        target_rate: float,
        versions: tuple[int, ...],
    ) -> None:
        """CHALLENGE, HELLO with the proof of possession, the donor's proven reply; all
        within ``timeout``. The token's MAC never leaves this process."""
        deadline = time.monotonic() + self.timeout
        header, _, meta = self._recv_handshake(deadline)
        challenge, server_nonce = handshake.parse_challenge(header, meta)
        if not set(versions).intersection(challenge.versions):
            raise VersionError(
                f"client speaks {sorted(versions)}, donor {sorted(challenge.versions)}"
            )
        nonce = secrets.token_bytes(handshake.NONCE_SIZE)
        try:
            hello = handshake.Hello(
                versions=list(versions),
                lease=token.lease,
                donor=token.donor,
                expiry=token.expiry,
                nonce=nonce.hex(),
                transport=transport,  # type: ignore[arg-type]
                host=host_id(),
                credits=credits,
                frame_bytes=frame_bytes,
                target_rate=target_rate,
                ring=True,
            )
        except ValueError as exc:
            raise RemoteGPUError(f"cannot say HELLO: {exc}") from None
        secret = token.mac_bytes
        self._tr.send_frames([handshake.hello_frame(hello, secret, server_nonce)])
        key = session_key(secret, nonce, server_nonce)
        header, raw, meta = self._recv_handshake(deadline)
        if header.lease != token.lease and header.op != Op.ERROR:
            raise FrameError("the donor answered for another lease")
        body = handshake.parse_accept(header, raw, meta, key, nonce)
        if body.version not in versions:
            raise VersionError(f"donor chose version {body.version}, not one of {versions}")
        if body.credits > credits:
            raise FrameError(f"donor granted {body.credits} credits, more than asked")
        if transport != "auto" and body.transport != transport:
            raise RemoteGPUError(f"donor cannot use transport {transport!r} for this client")
        self.version = body.version
        self.donor = body.donor
        self.credits = body.credits
        self.slot_size = body.slot_size
        self.transport = body.transport
        self.functions = list(body.functions)
        self.idempotent = frozenset(body.idempotent or ())
        if body.transport == "shm":
            assert body.arena is not None and body.arena_size is not None  # parse_accept
            ctl = ctl_size(body.credits) if body.ring is not None else 0
            if body.slot_size % PAGE or body.arena_size != (
                body.credits * body.slot_size + align(ctl, PAGE) + SEAL_SIZE
            ):
                raise FrameError("the arena's size does not match its slots")
            self.arena = Arena.open_sealed(
                token.lease, body.arena, body.arena_size, body.credits, body.slot_size, key
            )
            if body.ring is not None:
                self._ring = Ring(self.arena, body.ring.entries, "client")
        self._key = key
        log.info(
            "lease connected",
            lease=self.lease,
            donor=self.donor,
            transport=self.transport,
            credits=self.credits,
        )

    def _recv_handshake(self, deadline: float) -> tuple[Header, bytes, bytes]:
        """The next handshake frame (header, its raw bytes, metadata) before ``deadline``."""
        left = deadline - time.monotonic()
        if left <= 0 or not self._tr.wait_readable(left):
            raise DeadlineExceeded("the donor did not answer the handshake in time")
        raw = bytes(self._tr.recv_header())
        header = unpack(raw, HELLO_KEY, MAX_META)
        return header, raw, self._recv_meta(header)

    def _recv_meta(self, header: Header, src: _Source | None = None) -> bytes:
        buf = bytearray(header.length)
        (src or self._tr).recv_payload_into(memoryview(buf))
        return bytes(buf)

    # ---- calls

    def submit(self, name: str, *arrays: np.ndarray) -> Future[Result]:
        if self._ring is not None:
            return self._submit_ring(name, arrays)
        if self._failure is not None:
            raise self._failure
        arrs = [
            a if a.flags.c_contiguous else np.array(a, order="C") for a in map(np.asarray, arrays)
        ]
        for a in arrs:
            dtype_code(a.dtype)
        need = sum(align(a.nbytes) for a in arrs)
        if need >= LARGE and self._auto_receiver and self._receiver is None:
            self._start_receiver()
        if need > self.slot_size:
            raise MemoryQuotaExceeded(
                f"arguments of {need} bytes exceed the lease's {self.slot_size}-byte slot"
            )
        slot = self._take_slot()
        fut = _Call(self)
        try:
            with self._send_lock:
                seq = next(self._seq) & 0xFFFFFFFF
                self._pending[seq] = (fut, time.perf_counter(), slot)
                self._check_failure(seq)
                frames = self._invoke_frames(seq, slot, name, arrs)
                if self._ring is not None:
                    self._ring.post([bytes(b) for f in frames for b in f if b is not None])
                else:
                    self._tr.send_frames(frames, self._drain)
                self._out += sum(a.nbytes for a in arrs)
        except OSError as exc:
            self._pending.pop(seq, None)
            self._release(slot)
            raise self._send_failed(exc) from exc
        except BaseException as exc:
            self._pending.pop(seq, None)
            self._release(slot)
            self._fail(exc)
            raise
        return fut

    def _submit_ring(self, name: str, arrays: tuple[np.ndarray, ...]) -> Future[Result]:
        """``submit`` on a shared-memory lease with rings: copy the arrays into a free
        slot, post the request's frames in the ring, ring the worker's doorbell."""
        if self._failure is not None:
            raise self._failure
        arrs: list[np.ndarray] = []
        need = 0
        for x in arrays:
            a = np.asarray(x)
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            arrs.append(a)
            need += -(-a.nbytes // ALIGN) * ALIGN
        if need > self.slot_size:
            raise MemoryQuotaExceeded(
                f"arguments of {need} bytes exceed the lease's {self.slot_size}-byte slot"
            )
        free = self._free
        if not free and self._viewed:
            self._reclaim()  # the slots whose views are gone
        try:
            slot = free.pop()
        except IndexError:
            slot = self._take_slot()
        # The replies that are here already: read them now, while this thread's caches
        # still hold what reading needs (after a large copy, they would not).
        if self._read_lock.acquire(blocking=False):
            ring = self._ring
            assert ring is not None
            try:
                while ring.ready():
                    self._read_ring_entry(ring.take())
            except (RemoteGPUError, OSError, ValueError) as exc:
                self._fail(exc if not self._closed else RemoteGPUError("client closed"))
            finally:
                self._read_lock.release()
        try:
            mem = self._mem
            base = cursor = slot * self.slot_size
            specs: list[ArraySpec] = []
            nbytes = 0
            for a in arrs:
                n = a.nbytes
                nbytes += n
                if n:
                    mem[cursor : cursor + n] = memoryview(a).cast("B")  # type: ignore[arg-type]
                specs.append((dtype_code(a.dtype), a.shape, cursor, n))
                cursor += -(-n // ALIGN) * ALIGN
            meta = name.encode()
        except BaseException:
            self._release(slot)
            raise
        fut = _Call(self)
        pending = self._pending
        with self._send_lock:
            # Numbered where posted: requests enter the ring in order (the worker refuses
            # any other order, see ``protocol.seq_after``).
            seq = next(self._seq) & 0xFFFFFFFF
            try:
                entry = pack_message(self._key, _INVOKE, self.lease, seq, base, meta, specs)
            except BaseException:
                self._release(slot)
                raise
            try:
                pending[seq] = (fut, time.perf_counter(), slot)
                if self._failure is not None:
                    raise self._failure
                self._ring.post(entry)  # type: ignore[union-attr]
                self._out += nbytes
            except BaseException as exc:
                if pending.pop(seq, None) is not None:
                    self._release(slot)
                if exc is not self._failure:
                    self._fail(exc)
                raise
        return fut

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        return self.submit(name, *arrays).result(self.timeout)

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every submitted call has completed."""
        self._progress(lambda: not self._pending, self.timeout if timeout is None else timeout)

    def _take_slot(self) -> int:
        deadline = time.monotonic() + self.timeout
        delay = 1e-4
        while True:
            try:
                return self._free.pop()
            except IndexError:
                pass
            if self._viewed and self._reclaim():
                continue
            if self._failure is not None:
                raise self._failure
            if self._pending:
                self._progress(
                    lambda: bool(self._free) or not self._pending, deadline - time.monotonic()
                )
                continue
            # Nothing in flight: every slot is pinned by result views the caller holds,
            # maybe in another thread. Look again now and then.
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(
                    f"all {self.credits} slots are held by result views; "
                    "drop some results (or use views=False)"
                )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.01)

    def _reclaim(self) -> int:
        """Free the slots none of whose result views is alive any more; returns how many.
        (Readers append to ``_viewed`` without the lock, once a slot's views exist.)"""
        pins, unpinned, viewed = self._pins, self._unpinned, self._viewed
        freed = 0
        with self._slot_lock:
            for i in list(viewed):
                if sys.getrefcount(pins[i]) <= unpinned:
                    viewed.remove(i)
                    self._free.append(i)
                    freed += 1
        return freed

    def _invoke_frames(
        self, seq: int, slot: int | None, name: str, arrs: list[np.ndarray]
    ) -> list[Frame]:
        arena = self.arena
        base = 0 if slot is None or arena is None else arena.slot_base(slot)
        specs: list[ArraySpec] = []
        cursor = base
        for a in arrs:
            shape = tuple(int(d) for d in a.shape)
            code = dtype_code(a.dtype)
            if arena is None:  # a stream lease: each payload follows its header
                specs.append((code, shape, 0, a.nbytes))
            else:  # copied into the request's slot; the header says where
                np.copyto(arena.array(cursor, code, shape), a, casting="no")
                specs.append((code, shape, cursor, a.nbytes))
                cursor = align(cursor + a.nbytes)
        inline = None if arena is not None else [_bytes_of(a) for a in arrs]
        meta = name.encode()
        return message_frames(self._key, Op.INVOKE, self.lease, seq, specs, inline, base, meta)

    def heartbeat(self) -> float:
        """Round trip of a HEARTBEAT, in seconds."""
        fut = _Call(self)
        start = time.perf_counter()
        with self._send_lock:
            seq = next(self._seq) & 0xFFFFFFFF
            self._pending[seq] = (fut, start, -1)
            self._check_failure(seq)
            try:
                self._tr.send_frames(
                    [(Header(Op.HEARTBEAT, self.lease, seq).pack(self._key), None)],
                    self._drain,
                )
            except OSError as exc:
                raise self._send_failed(exc) from exc
        fut.result(self.timeout)
        return time.perf_counter() - start

    @property
    def _drain(self) -> Callable[[], bool] | None:
        return None if self._receiver is not None else self._drain_one

    def _drain_one(self) -> bool:
        """Read one reply now if no other thread is reading (called while sending)."""
        if not self._read_lock.acquire(blocking=False):
            return False
        try:
            if self._failure is None:
                self._read_some(0.0)
        except (RemoteGPUError, OSError, ValueError) as exc:
            self._fail(exc)
        finally:
            self._read_lock.release()
        return True

    def _check_failure(self, seq: int) -> None:
        """After registering ``seq``: if the connection has failed meanwhile, give up."""
        if self._failure is not None:
            self._pending.pop(seq, None)
            raise self._failure

    def _send_failed(self, exc: OSError) -> BaseException:
        """The donor closed the connection: read why (its ERROR is usually waiting)."""
        if self._receiver is not None:
            self._receiver.join(min(self.timeout, 5.0))  # it reads up to the end
        else:
            self._progress(lambda: False, 0.0, quiet=True)  # reads what is there
        self._fail(exc)
        assert self._failure is not None
        return self._failure

    # ---- replies

    def _release(self, slot: int) -> None:
        if slot >= 0:
            self._free.append(slot)

    def _await(self, fut: _Call, timeout: float | None) -> None:
        """Wait for ``fut``: on the ring, first read the replies that are there already
        (one lock, no clock), then wait the general way."""
        ring = self._ring
        if ring is not None and self._read_lock.acquire(blocking=False):
            try:
                while not fut._over and ring.ready():
                    self._read_ring_entry(ring.take())
            except (RemoteGPUError, OSError, ValueError) as exc:
                self._fail(exc if not self._closed else RemoteGPUError("client closed"))
            finally:
                self._read_lock.release()
        if not fut._over:
            self._progress(fut._finished, timeout)

    def _progress(
        self, until: Callable[[], bool], timeout: float | None, quiet: bool = False
    ) -> None:
        """Read replies until ``until()`` holds; TimeoutError after ``timeout`` seconds."""
        if self._receiver is not None:
            with self._changed:
                held = self._changed.wait_for(lambda: until() or self._failure is not None, timeout)
            if not held and not quiet:
                raise DeadlineExceeded("no reply from the donor in time")
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not until():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._failure is not None:
                return  # every pending future has its exception already
            if self._receiver is not None:  # started meanwhile: it reads now
                self._progress(until, left, quiet)
                return
            ready = False
            if self._read_lock.acquire(timeout=-1 if left is None else left):
                try:
                    if until() or self._failure is not None:
                        return
                    ready = self._read_some(left)
                except (RemoteGPUError, OSError, ValueError) as exc:
                    self._fail(exc if not self._closed else RemoteGPUError("client closed"))
                    return
                finally:
                    self._read_lock.release()
            if not ready:
                if quiet:
                    return
                raise DeadlineExceeded("no reply from the donor in time")

    def _read_some(self, timeout: float | None) -> bool:
        """Read one reply, waiting up to ``timeout``; False if none came."""
        ring = self._ring
        if ring is None:
            if not self._tr.wait_readable(timeout, self.spin):
                return False
            self._read_reply(self._tr)
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        # The control channel (heartbeats, refusals) is read when its bytes are buffered
        # already or a wait woke for them: looked at before every wait, it cost a failed
        # read and a poll, two system calls, per call. One without a descriptor is
        # looked at every time (its wait_readable says True).
        control = self._tr.fileno()
        others = () if control is None else (control,)
        look = control is None
        while True:
            if ring.ready():
                self._read_ring_entry(ring.take())
                return True
            if (look or self._tr.buffered()) and self._tr.wait_readable(0):
                self._read_reply(self._tr)
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if self._tr.wait_readable(0):  # a last look before giving up
                    self._read_reply(self._tr)
                    return True
                return False
            spin = self.spin if left is None else min(self.spin, left)
            look = bool(ring.wait(left, *others, spin=spin)) or control is None

    def _read_reply(self, src: _Source) -> None:
        head = unpack(src.recv_header(), self._key, MAX_META)
        meta = self._recv_meta(head, src) if head.length else b""
        entry = self._pending.pop(head.seq, None)
        if entry is None:
            for _ in range(head.parts):
                self._recv_array(src, head, -1, None)
            if head.op == Op.ERROR:
                raise handshake.parse_error(meta)
            return
        fut, start, slot = entry
        # With views, the pin returns the slot once the caller has dropped every result.
        pin = (
            self._pins[slot]
            if head.parts and slot >= 0 and head.op == Op.RESULT and self._view_results()
            else None
        )
        try:
            arrays = tuple(self._recv_array(src, head, slot, pin) for _ in range(head.parts))
        except BaseException:
            self._pending[head.seq] = entry  # failed below: _fail completes it
            raise
        if head.op == Op.HEARTBEAT:
            fut.set_result(())
            return
        if pin is None:
            self._release(slot)
        else:
            self._viewed.append(slot)
        del pin
        if head.op == Op.RESULT:
            self._in += sum(a.nbytes for a in arrays)
            self._note_call(start)
            fut.set_result(arrays)
        elif head.op == Op.ERROR:
            err = handshake.parse_error(meta)
            metrics.ERRORS.labels("client", err.code.value).inc()
            fut.set_exception(err)
        else:
            raise FrameError(f"unexpected {head.op.name} from the donor")

    def _view_results(self) -> bool:
        """Whether the next result should be a view of its slot rather than a copy."""
        if len(self._viewed) >= self._max_pins and self._viewed:
            self._reclaim()
        return len(self._viewed) < self._max_pins

    def _read_ring_entry(self, data: bytes) -> None:
        """One reply from the ring: RESULT here; anything else the general way."""
        head = unpack(data[:HEADER_SIZE], self._key, MAX_META)
        entry = self._pending.pop(head.seq, None) if head.op == _RESULT else None
        if entry is None:
            self._read_reply(_Entry(data))
            return
        fut, start, slot = entry
        size = self.slot_size
        base = slot * size
        end = base + size
        try:
            specs = unpack_arrays(data, HEADER_SIZE + head.length, self._key, head, size)
            for _, _, at, n in specs:
                if not (base <= at and at + n <= end):
                    raise FrameError("SHM result outside the request's slot")
                self._in += n
        except BaseException:
            self._pending[head.seq] = entry  # failed below: _fail completes it
            raise
        viewed = self._viewed
        if specs and (len(viewed) < self._max_pins or (viewed and self._view_results())):
            pin = self._pins[slot]  # the slot is free again once every view is gone
            # Slices of the pin, not frombuffer: a view must keep the pin itself alive.
            views: list[np.ndarray] = []
            for dtype, shape, at, n in specs:
                v = pin[at - base : at - base + n].view(numpy_dtype(dtype), np.ndarray)
                views.append(v if len(shape) == 1 else v.reshape(shape))
            arrays = tuple(views)
            viewed.append(slot)  # after the views exist: _reclaim sees them
        else:
            mem = self._mem
            out: list[np.ndarray] = []
            for dtype, shape, at, n in specs:
                a = self._spares.empty(shape, numpy_dtype(dtype))
                if n:
                    memoryview(a).cast("B")[:] = mem[at : at + n]  # type: ignore[arg-type]
                out.append(a)
            self._free.append(slot)
            arrays = tuple(out)
        self._note_call(start)
        fut.set_result(arrays)

    def _note_call(self, start: float) -> None:
        """Note a call's latency (under the read lock); flush the notes when due."""
        now = time.perf_counter()
        latencies = self._latencies
        latencies.append(now - start)
        if now >= self._flush_at or len(latencies) >= 256:
            self._flush_metrics(now)

    def _flush_metrics(self, now: float) -> None:
        """Add the calls, latencies and bytes counted since the last flush to the metrics.
        The bytes sent are counted under the send lock: taken here only if free (a sender
        that reads a reply while it waits to send holds it), else they wait a flush."""
        out = 0
        if self._send_lock.acquire(blocking=False):
            out, self._out = self._out, 0
            self._send_lock.release()
        latencies, self._latencies = self._latencies, []
        got, self._in = self._in, 0
        self._m_out.inc(out)
        self._m_calls.inc(len(latencies))
        self._m_in.inc(got)
        for seconds in latencies:
            self._m_latency.observe(seconds)
        self._flush_at = now + METRICS_INTERVAL

    def _recv_array(self, src: _Source, head: Header, slot: int, pin: _Pin | None) -> np.ndarray:
        h = unpack(src.recv_header(), self._key, self.slot_size)  # results fit their slot
        if h.seq != head.seq or h.part == 0 or h.op != head.op:
            raise FrameError("array frame out of sequence")
        if h.flags is Flags.SHM:  # identity: unpack gives one of two members
            if self.arena is None or slot < 0:
                raise FrameError("SHM result without a slot")
            base = self.arena.slot_base(slot)
            if not (base <= h.offset and h.offset + h.length <= base + self.arena.slot_size):
                raise FrameError("SHM result outside the request's slot")
            if pin is None:
                copy = self._spares.empty(h.shape, numpy_dtype(h.dtype))
                np.copyto(copy, self.arena.array(h.offset, h.dtype, h.shape), casting="no")
                return copy
            raw = pin[h.offset - base : h.offset - base + h.length]
            return raw.view(numpy_dtype(h.dtype), np.ndarray).reshape(h.shape)
        out = self._spares.empty(h.shape, numpy_dtype(h.dtype))
        if h.length:
            src.recv_payload_into(_bytes_of(out))
        return out

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = (
                exc
                if isinstance(exc, RemoteGPUError)
                else RemoteGPUError(f"connection lost: {exc!r}")
            )
        while True:
            try:
                _, (fut, _, _) = self._pending.popitem()
            except KeyError:
                break
            if not fut.done():
                fut.set_exception(self._failure)
        with self._changed:
            self._changed.notify_all()

    def _start_receiver(self) -> None:
        with self._changed:
            if self._receiver is None:
                self._receiver = threading.Thread(
                    target=self._receive_loop, daemon=True, name=f"remote-gpu-{self.lease}"
                )
                self._receiver.start()

    def _receive_loop(self) -> None:
        fd = self._tr.fileno()
        poller = select.poll()
        if fd is not None:
            poller.register(fd, select.POLLIN)
        while self._failure is None:
            try:
                # Under the read lock, like any caller that was reading when it started.
                with self._read_lock:
                    got = fd is None or self._tr.wait_readable(0)
                    if got:
                        self._read_reply(self._tr)
                if not got:
                    poller.poll(100)  # bounded: a caller may have buffered a reply meanwhile
                    continue
            except BaseException as exc:
                self._fail(exc if not self._closed else RemoteGPUError("client closed"))
                return
            with self._changed:
                self._changed.notify_all()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception), self._send_lock:
            self._tr.send_frames([(Header(Op.CLOSE, self.lease, 0).pack(self._key), None)])
        self._tr.close()
        if self._receiver is not None:
            self._receiver.join(self.timeout)
        self._fail(RemoteGPUError("client closed"))
        self._flush_metrics(time.perf_counter())
        if self._ring is not None:
            self._ring.close()
        if self.arena is not None:
            # Unmapped now unless the caller still holds result views (then once they go).
            self._mem.release()
            self._pins = []
            self.arena.close()
        self._spares.clear()

    def __enter__(self) -> RemoteGPU:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DType", "RemoteGPU"]
