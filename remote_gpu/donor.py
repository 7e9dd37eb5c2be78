"""The donor server: asyncio front end, one worker process per lease.

A connection opens with the donor's CHALLENGE and the client's HELLO (the token's claims
and a proof of possession of its MAC, versions, wanted transport, declared load; see
``protocol``); the donor checks the proof, the claims, admission and the lease's
uniqueness, creates the lease's arena and worker, and answers HELLO with the negotiated
version, credits and transport. Then INVOKE messages flow, at most ``credits`` in
flight, each answered by RESULT or ERROR. Malformed frames get an ERROR and the
connection is closed; other leases carry on.

Before a connection has authenticated, it costs the donor a descriptor and a task only:
it must complete its HELLO within ``handshake_timeout``, one peer address holds at most
``max_connections_per_peer`` connections, and a failing ``accept`` (out of descriptors)
makes the listener back off and retry, never stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import multiprocessing
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from composable_dra.process import logs
from composable_dra.serving.accept import Acceptor, listen
from composable_dra.serving.limits import PER_PEER, Budget, ServerLimits, process_budget
from composable_dra.serving.token_bucket import TokenBucket
from remote_gpu import handshake, idempotency, metrics
from remote_gpu.admission import AdmissionController
from remote_gpu.arena import Arena, align
from remote_gpu.errors import (
    AuthError,
    Code,
    FrameError,
    RemoteGPUError,
)
from remote_gpu.errors import Fatal as _Fatal
from remote_gpu.lending import LendingMonitor
from remote_gpu.protocol import (
    HELLO_KEY,
    MAX_META,
    SUPPORTED_VERSIONS,
    VERSION,
    ArraySpec,
    Flags,
    Header,
    Op,
    place_array,
    seq_after,
    session_key,
    unpack,
)
from remote_gpu.ring import ctl_size, supported
from remote_gpu.tokens import check_claims, mac_for
from remote_gpu.transports import Frame, ServerTransport, choose, host_id
from remote_gpu.transports.tcp import TcpServerTransport
from remote_gpu.worker import Session, Stats, result_frames

log = logs.get(__name__)

_MP = multiprocessing.get_context("forkserver")
_MP.set_forkserver_preload(["numpy", "remote_gpu.worker", "remote_gpu.builtins"])


@dataclass
class DonorConfig:
    name: str
    secret: bytes = field(repr=False)
    allow: dict[str, str]
    memory_quota: int = 64 << 20
    max_credits: int = 4
    rate_limit: float = 0.0
    rate_burst: float = 16.0
    link_bandwidth: float | None = None
    headroom: float = 1.0
    transports: tuple[str, ...] = ("shm", "tcp")
    worker_start_timeout: float = 30.0
    # Hand authenticated TCP connections to the lease's worker (see ``worker``); when
    # False, or for channels that cannot be handed over (UCX), the donor relays requests.
    direct: bool = True
    # How long (seconds) a worker keeps watching for the next request after one (its
    # ring, or its TCP connection) before it sleeps: a core's time traded for wake-ups,
    # which between the vCPUs of a virtual machine cost tens of microseconds each. The
    # spinner yields its CPU between looks (``ring.Ring.wait``, ``tcp.Reader.spin``).
    spin: float = 250e-6
    # Unauthenticated connections: seconds to complete the HELLO, and how many TCP
    # connections (handshaking or serving a lease) one peer address may hold.
    handshake_timeout: float = 10.0
    max_connections_per_peer: int = 64
    # The connections this process may hold, shared with its other servers (None: the
    # process's, sized from its descriptor limit).
    budget: Budget | None = None
    # With a lease API (``lease_api``): only the leases it opened may connect.
    lease_gate: Callable[[int], bool] | None = None
    # What the lending policy reads (link load, per-function latency); None: one with
    # the link bandwidth and no latency priors.
    monitor: LendingMonitor | None = None


def _refuse(conn: socket.socket, reason: str) -> None:
    """The data plane's answer to a connection over its peer's or the process's bound:
    an ERROR frame, if the socket takes it at once."""
    metrics.ERRORS.labels("donor", "too_many_connections").inc()
    why = "too many connections" + (" from this address" if reason == PER_PEER else "")
    body = handshake.error_body(Code.RATE_LIMITED.value, why)
    frame = Header(Op.ERROR, 0, 0, length=len(body)).pack(HELLO_KEY) + body
    conn.send(frame, socket.MSG_DONTWAIT)


class Lease:
    def __init__(
        self, lease: int, arena: Arena, credits: int, bucket: TokenBucket, expiry: float
    ) -> None:
        self.id = lease
        self.expiry = expiry  # the token's: until then, a closed lease's token stays dead
        self.opened = False
        self.arena = arena
        self.credits = credits
        self.bucket = bucket
        self.busy: set[int] = set()
        self.pending: dict[int, asyncio.Future[tuple[Any, ...]]] = {}
        self.proc: BaseProcess | None = None
        self.pipe: Connection | None = None
        self.shm = False
        self.transport = "tcp"
        # Set when the worker stops serving a direct connection or the rings: None, or
        # the (code, message, seq) of the defect that made it stop.
        self.closed: asyncio.Future[tuple[str, str, int] | None] | None = None
        self.ring = False

    def free_slot(self) -> int | None:
        for slot in range(self.arena.slots):
            if slot not in self.busy:
                return slot
        return None


class Donor:
    def __init__(self, config: DonorConfig) -> None:
        self.config = config
        self.admission = AdmissionController(config.link_bandwidth, config.headroom)
        self.monitor = config.monitor or LendingMonitor(
            config.link_bandwidth, functions=config.allow
        )
        self.leases: dict[int, Lease] = {}
        self._idempotent = idempotency.idempotent_names(config.allow)
        self._server_tasks: set[asyncio.Task[None]] = set()
        self._listeners: list[socket.socket] = []
        self._accept_tasks: list[asyncio.Task[None]] = []
        self._host = host_id()
        # Closed leases until their tokens expire: the ids, and (expiry, id) in a heap.
        self._closed: dict[int, float] = {}
        self._expiries: list[tuple[float, int]] = []
        self._lease_tasks: dict[int, asyncio.Task[Any]] = {}  # the connection serving each

    # ---- listening

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> tuple[str, int]:
        sock = listen(host, port)
        self._listeners.append(sock)
        config = self.config
        acceptor = Acceptor(
            "donor",
            ServerLimits(config.max_connections_per_peer, config.handshake_timeout),
            config.budget or process_budget(),
            self._admit,
            _refuse,
            lambda _exc: metrics.ERRORS.labels("donor", "accept_failed").inc(),
        )
        self._accept_tasks.append(asyncio.create_task(acceptor.run(sock)))
        bound = sock.getsockname()
        log.info("donor listening", donor=self.config.name, address=f"{bound[0]}:{bound[1]}")
        return bound[0], bound[1]

    def _admit(self, conn: socket.socket, _peer: str, release: Callable[[], None]) -> None:
        """Serve ``conn`` (the acceptor holds its place in the budget until ``release``)."""
        task = self.serve(TcpServerTransport(conn))
        task.add_done_callback(lambda _: release())

    def serve(self, transport: ServerTransport) -> asyncio.Task[None]:
        """Serve one connection (from any transport's listener) in its own task."""
        task = asyncio.create_task(self._connection(transport))
        self._server_tasks.add(task)
        task.add_done_callback(self._server_tasks.discard)
        return task

    async def close(self) -> None:
        for t in self._accept_tasks:
            t.cancel()
        for s in self._listeners:
            s.close()
        for t in list(self._server_tasks):
            t.cancel()
        await asyncio.gather(*self._accept_tasks, *self._server_tasks, return_exceptions=True)

    # ---- one connection

    async def _connection(self, tr: ServerTransport) -> None:
        lease: Lease | None = None
        key = HELLO_KEY
        send_lock = asyncio.Lock()
        try:
            lease, key, shm = await self._hello(tr)
            if (task := asyncio.current_task()) is not None:
                self._lease_tasks[lease.id] = task
            if lease.ring:
                await self._serve_ring_lease(tr, lease, key, send_lock)
            elif self.config.direct and isinstance(tr, TcpServerTransport):
                await self._hand_over(tr, lease, key, shm)
            else:
                await self._serve_lease(tr, lease, key, shm, send_lock)
        except _Fatal as exc:
            metrics.ERRORS.labels("donor", exc.code.value).inc()
            # A peer that never said HELLO is not worth a warning each (floods).
            quiet = exc.code is Code.DEADLINE_EXCEEDED and lease is None
            (log.debug if quiet else log.warning)(
                "refusing connection", peer=tr.peer, code=exc.code.value, reason=exc.message
            )
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.config.handshake_timeout), send_lock:
                    await tr.send_frames(
                        [_error(lease.id if lease else 0, exc.seq, exc.code, exc.message, key)]
                    )
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("connection failed", peer=tr.peer)
        finally:
            tr.close()
            if lease is not None:
                self._lease_tasks.pop(lease.id, None)
                await self._end_lease(lease)

    async def _read_meta(self, tr: ServerTransport, header: Header) -> bytes:
        buf = bytearray(header.length)
        await tr.recv_payload_into(memoryview(buf))
        return bytes(buf)

    # Long because the handshake's checks follow the protocol's order (version, proof of
    # possession, the token's claims, admission, the lease's uniqueness, its arena), each
    # answering the client with its own error; split, they would hand half-checked state on.
    async def _hello(self, tr: ServerTransport) -> tuple[Lease, bytes, bool]:
        server_nonce = secrets.token_bytes(handshake.NONCE_SIZE)
        try:
            async with asyncio.timeout(self.config.handshake_timeout):
                await tr.send_frames(
                    [handshake.challenge_frame(sorted(SUPPORTED_VERSIONS), server_nonce)]
                )
                raw = bytes(await tr.recv_header())
                try:
                    header = unpack(raw, HELLO_KEY, MAX_META)
                except FrameError as exc:
                    raise _Fatal(Code.BAD_FRAME, str(exc)) from None
                if header.op != Op.HELLO:
                    raise _Fatal(Code.BAD_FRAME, "the first frame must be a HELLO")
                if header.length > handshake.MAX_HELLO:
                    raise _Fatal(Code.BAD_FRAME, f"a HELLO of {header.length} bytes")
                meta = await self._read_meta(tr, header)
        except TimeoutError:
            raise _Fatal(Code.DEADLINE_EXCEEDED, "no HELLO in time") from None
        try:
            hello, covered, proof = handshake.parse_hello(header, raw, meta)
        except FrameError as exc:
            raise _Fatal(Code.BAD_FRAME, str(exc)) from None
        common = SUPPORTED_VERSIONS.intersection(hello.versions)
        if not common:
            raise _Fatal(
                Code.UNSUPPORTED_VERSION,
                f"client speaks {sorted(hello.versions)}, donor {sorted(SUPPORTED_VERSIONS)}",
            )
        secret = mac_for(self.config.secret, hello.lease, hello.donor, hello.expiry)
        try:
            handshake.check_hello_proof(secret, server_nonce, covered, proof)
            check_claims(hello.donor, hello.expiry, self.config.name)
        except AuthError as exc:
            raise _Fatal(Code.AUTH_FAILED, str(exc)) from None
        if self._lease_closed(hello.lease):
            raise _Fatal(Code.AUTH_FAILED, f"lease {hello.lease} has closed; its token is spent")
        gate = self.config.lease_gate
        if gate is not None and not gate(hello.lease):
            raise _Fatal(Code.AUTH_FAILED, f"lease {hello.lease} is not open on this donor")
        if hello.lease in self.leases:
            raise _Fatal(Code.LEASE_BUSY, f"lease {hello.lease} already has a connection")
        offers = [t for t in self.config.transports if t in ("shm", tr.name)]
        try:
            wanted = choose(hello.transport, offers, hello.host == self._host)
        except ValueError:
            wanted = tr.name
        demand = AdmissionController.demand(hello.frame_bytes, hello.target_rate)
        if not self.admission.try_admit(hello.lease, demand):
            metrics.ADMISSION_REFUSALS.inc()
            raise _Fatal(
                Code.ADMISSION_REFUSED,
                f"link would saturate: {self.admission.load + demand:.0f} B/s wanted, "
                f"{self.admission.capacity:.0f} B/s available",
            )
        credits = max(1, min(hello.credits, self.config.max_credits))
        use_ring = wanted == "shm" and self.config.direct and hello.ring and supported()
        try:
            arena = Arena.create(
                self.config.memory_quota,
                credits,
                ctl_size(credits) if use_ring else 0,
                lease=hello.lease,
            )
        except OSError as exc:  # out of descriptors or shared memory: say so
            self.admission.release(hello.lease)
            raise _Fatal(Code.INTERNAL, f"cannot open the lease: {exc.strerror}") from None
        except BaseException:
            self.admission.release(hello.lease)
            raise
        lease = Lease(
            hello.lease,
            arena,
            credits,
            TokenBucket(self.config.rate_limit, self.config.rate_burst),
            hello.expiry,
        )
        lease.shm, lease.transport, lease.ring = wanted == "shm", wanted, use_ring
        self.leases[hello.lease] = lease
        try:
            await self._start_worker(lease)
        except OSError as exc:
            await self._end_lease(lease)
            raise _Fatal(
                Code.INTERNAL, f"cannot start the lease's worker: {exc.strerror}"
            ) from None
        except BaseException:
            await self._end_lease(lease)
            raise
        client_nonce = bytes.fromhex(hello.nonce)
        key = session_key(secret, client_nonce, server_nonce)
        accept = handshake.Accept(
            version=max(common),
            donor=self.config.name,
            credits=credits,
            transport=wanted,  # type: ignore[arg-type]
            slot_size=arena.slot_size,
            functions=sorted(self.config.allow),
            idempotent=self._idempotent if max(common) >= 3 else None,
        )
        if wanted == "shm":
            arena.seal(key, lease.id)
            accept = accept.model_copy(update={"arena": arena.path.name, "arena_size": arena.size})
        if use_ring:
            accept = accept.model_copy(update={"ring": handshake.RingInfo(entries=credits)})
        await tr.send_frames([handshake.accept_frame(accept, lease.id, key, client_nonce)])
        lease.opened = True
        metrics.LEASES.inc()
        metrics.LEASES_TOTAL.labels(wanted).inc()
        log.info("lease opened", lease=lease.id, peer=tr.peer, transport=wanted, credits=credits)
        return lease, key, wanted == "shm"

    def revoke(self, lease: int, expiry: float) -> None:
        """End ``lease`` from outside (its lease was closed): its token opens nothing any
        more, and the connection serving it, if any, ends with its worker and arena."""
        self._closed[lease] = expiry
        heapq.heappush(self._expiries, (expiry, lease))
        task = self._lease_tasks.pop(lease, None)
        if task is not None:
            task.cancel()

    def _lease_closed(self, lease: int) -> bool:
        """Whether ``lease`` has been open and closed (forgetting the expired ones)."""
        now = time.time()
        while self._expiries and self._expiries[0][0] <= now:
            _, gone = heapq.heappop(self._expiries)
            if self._closed.get(gone, now + 1) <= now:
                del self._closed[gone]
        return lease in self._closed

    async def _start_worker(self, lease: Lease) -> None:
        parent, child = _MP.Pipe()
        proc = _MP.Process(
            target=_worker_entry,
            args=(
                child,
                str(lease.arena.path),
                lease.arena.size,
                lease.arena.slots,
                lease.arena.slot_size,
                dict(self.config.allow),
            ),
            daemon=True,
        )
        await asyncio.get_running_loop().run_in_executor(None, proc.start)
        child.close()
        lease.proc, lease.pipe = proc, parent
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            try:
                while parent.poll():
                    msg = parent.recv()
                    if msg[0] == "ready":
                        if not ready.done():
                            ready.set_result(None)
                        continue
                    self._on_worker_message(lease, msg)
            except (EOFError, OSError):
                loop.remove_reader(parent.fileno())
                exc = RemoteGPUError("worker exited", Code.WORKER_DIED)
                if not ready.done():
                    ready.set_exception(exc)
                for f in lease.pending.values():
                    if not f.done():
                        f.set_result(("err", 0, Code.WORKER_DIED.value, "worker exited"))
                lease.pending.clear()
                if lease.closed is not None and not lease.closed.done():
                    lease.closed.set_result((Code.WORKER_DIED.value, "worker exited", 0))

        loop.add_reader(parent.fileno(), on_readable)
        try:
            await asyncio.wait_for(ready, self.config.worker_start_timeout)
        except (TimeoutError, RemoteGPUError) as exc:
            raise _Fatal(Code.INTERNAL, f"worker did not start: {exc}") from None

    def _on_worker_message(self, lease: Lease, msg: tuple[Any, ...]) -> None:
        if msg[0] == "stats":
            self._measured(lease, msg[1])
        elif msg[0] in ("closed", "fatal"):
            if lease.closed is not None and not lease.closed.done():
                lease.closed.set_result(None if msg[0] == "closed" else tuple(msg[1:4]))
        else:
            fut = lease.pending.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def _hand_over(self, tr: TcpServerTransport, lease: Lease, key: bytes, shm: bool) -> None:
        """Give the authenticated connection to the lease's worker; wait until it ends."""
        assert lease.pipe is not None and lease.proc is not None and lease.proc.pid
        lease.closed = asyncio.get_running_loop().create_future()
        lease.pipe.send(("serve", self._session(lease, key)))
        fd = tr.detach()
        try:
            reduction.send_handle(lease.pipe, fd, lease.proc.pid)
        finally:
            os.close(fd)  # the worker holds its own descriptor now
        await lease.closed

    async def _serve_ring_lease(
        self, tr: ServerTransport, lease: Lease, key: bytes, send_lock: asyncio.Lock
    ) -> None:
        """Requests go through the lease's rings to its worker; this serves the control
        channel (HEARTBEAT, CLOSE) and reports the worker's refusals on it."""
        assert lease.pipe is not None
        lease.closed = asyncio.get_running_loop().create_future()
        lease.pipe.send(("ring", self._session(lease, key)))
        control = asyncio.ensure_future(self._serve_lease(tr, lease, key, True, send_lock))
        try:
            waiters: set[asyncio.Future[Any]] = {control, lease.closed}
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not control.done():
                control.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await control
        if control.done() and not control.cancelled():
            control.result()  # CLOSE, or a defect on the control channel
            return
        fatal = lease.closed.result()
        if fatal is not None:
            code, message, seq = fatal
            raise _Fatal(Code(code), message, seq)

    def _session(self, lease: Lease, key: bytes) -> Session:
        return Session(
            lease=lease.id,
            key=key,
            credits=lease.credits,
            shm=lease.shm,
            transport=lease.transport,
            rate_limit=self.config.rate_limit,
            rate_burst=self.config.rate_burst,
            ring=lease.ring,
            spin=self.config.spin,
        )

    async def _end_lease(self, lease: Lease) -> None:
        if lease.opened:  # its token opens nothing any more
            self._closed[lease.id] = lease.expiry
            heapq.heappush(self._expiries, (lease.expiry, lease.id))
        if self.leases.get(lease.id) is lease:
            del self.leases[lease.id]
            if lease.opened:
                metrics.LEASES.dec()
        self.admission.release(lease.id)
        if lease.pipe is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(lease.pipe.fileno())
            with contextlib.suppress(Exception):
                lease.pipe.send(None)
        try:
            if lease.proc is not None:
                proc = lease.proc
                await asyncio.get_running_loop().run_in_executor(None, _stop_process, proc)
            if lease.pipe is not None:
                with contextlib.suppress(EOFError, OSError):
                    while lease.pipe.poll():  # the worker's last counters
                        msg = lease.pipe.recv()
                        if msg[0] == "stats":
                            self._measured(lease, msg[1])
        finally:  # also when the donor shuts down meanwhile: leave nothing in /dev/shm
            if lease.pipe is not None:
                lease.pipe.close()
            for f in lease.pending.values():
                f.cancel()
            lease.arena.close()
        log.info("lease closed", lease=lease.id)

    async def _serve_lease(
        self, tr: ServerTransport, lease: Lease, key: bytes, shm: bool, send_lock: asyncio.Lock
    ) -> None:
        tasks: set[asyncio.Task[None]] = set()
        limit = lease.arena.slot_size
        last = 0  # the last request's sequence number on this channel
        try:
            while True:
                try:
                    header = unpack(await tr.recv_header(), key, max(limit, MAX_META))
                except FrameError as exc:
                    raise _Fatal(Code.BAD_FRAME, str(exc)) from None
                if header.lease != lease.id:
                    raise _Fatal(Code.BAD_FRAME, "frame for another lease", header.seq)
                if header.part != 0:
                    raise _Fatal(Code.BAD_FRAME, "array frame outside a message", header.seq)
                if header.op == Op.CLOSE:
                    return
                if not seq_after(header.seq, last):
                    raise _Fatal(
                        Code.BAD_SEQUENCE, f"request {header.seq} after {last}", header.seq
                    )
                last = header.seq
                if header.op == Op.HEARTBEAT:
                    await self._read_meta(tr, header)
                    reply = Header(Op.HEARTBEAT, lease.id, header.seq)
                    async with send_lock:
                        await tr.send_frames([(reply.pack(key), None)])
                    continue
                if header.op != Op.INVOKE:
                    raise _Fatal(Code.BAD_FRAME, f"unexpected {header.op.name}", header.seq)
                if lease.ring:
                    raise _Fatal(Code.BAD_FRAME, "this lease's requests go through its ring")
                job = await self._receive_invoke(tr, lease, key, header, shm)
                if job is None:
                    continue
                task = asyncio.create_task(self._run(tr, lease, key, header.seq, job, send_lock))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for t in tasks:
                t.cancel()

    async def _receive_invoke(
        self, tr: ServerTransport, lease: Lease, key: bytes, head: Header, shm: bool
    ) -> tuple[int, str, list[ArraySpec]] | None:
        seq = head.seq
        name = (await self._read_meta(tr, head)).decode("utf-8", "replace")
        if len(lease.busy) >= lease.credits:
            raise _Fatal(Code.FLOW_CONTROL, f"more than {lease.credits} requests in flight", seq)
        arena = lease.arena
        if shm:
            slot = arena.slot_of(head.offset)
            if slot is None or slot in lease.busy:
                raise _Fatal(Code.BAD_FRAME, "INVOKE names no free slot", seq)
        else:
            free = lease.free_slot()
            assert free is not None  # busy < credits == slots
            slot = free
        base = arena.slot_base(slot)
        lease.busy.add(slot)
        cursor = base
        specs: list[ArraySpec] = []
        for part in range(1, head.parts + 1):
            try:
                h = unpack(await tr.recv_header(), key, arena.slot_size)
            except FrameError as exc:
                raise _Fatal(Code.BAD_FRAME, str(exc), seq) from None
            offset = place_array(h, head, part, lease.id, shm, base, cursor, arena.slot_size)
            if not h.flags & Flags.SHM:
                await tr.recv_payload_into(arena.view(offset, h.length))
                metrics.BYTES.labels("donor", "in", lease.transport).inc(h.length)
                cursor = align(offset + h.length)
            specs.append((int(h.dtype), h.shape, offset, h.length))
        if shm:
            metrics.BYTES.labels("donor", "in", "shm").inc(sum(s[3] for s in specs))
        refusal: tuple[Code, str] | None = None
        if name not in self.config.allow:
            refusal = (Code.NOT_ALLOWED, f"{name!r} is not on this donor's allow-list")
        elif not lease.bucket.take():
            refusal = (Code.RATE_LIMITED, f"lease exceeds {self.config.rate_limit}/s")
        if refusal is not None:
            lease.busy.discard(slot)
            metrics.ERRORS.labels("donor", refusal[0].value).inc()
            await tr.send_frames([_error(lease.id, seq, refusal[0], refusal[1], key)])
            return None
        return slot, name, specs

    async def _run(
        self,
        tr: ServerTransport,
        lease: Lease,
        key: bytes,
        seq: int,
        job: tuple[int, str, list[ArraySpec]],
        send_lock: asyncio.Lock,
    ) -> None:
        slot, name, specs = job
        fut: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        lease.pending[seq] = fut
        assert lease.pipe is not None
        try:
            lease.pipe.send((seq, slot, name, specs))
            msg = await fut
            frames: list[Frame]
            if msg[0] == "ok":
                _, _, results, seconds = msg
                metrics.LATENCY.labels("donor").observe(seconds)
                metrics.INVOCATIONS.labels("donor").inc()
                moved = sum(s[3] for s in specs) + sum(r[3] for r in results)
                self.monitor.on_report(moved, [(name, seconds)], self._serving())
                frames = self._result_frames(lease, key, seq, results)
            else:
                _, _, code, message = msg
                metrics.ERRORS.labels("donor", code).inc()
                frames = [_error(lease.id, seq, Code(code), message, key)]
            async with send_lock:
                await tr.send_frames(frames)
        finally:
            lease.pending.pop(seq, None)
            lease.busy.discard(slot)

    def _serving(self) -> int:
        """Leases being served now: the concurrency a latency sample is measured at."""
        return sum(1 for lease in self.leases.values() if lease.opened)

    def _measured(self, lease: Lease, stats: Stats) -> None:
        _export(lease, stats)
        self.monitor.on_report(stats.bytes_in + stats.bytes_out, stats.calls, self._serving())

    def _result_frames(
        self, lease: Lease, key: bytes, seq: int, results: Sequence[ArraySpec]
    ) -> list[Frame]:
        inline = None if lease.shm else lease.arena
        frames = result_frames(key, lease.id, seq, results, inline)
        metrics.BYTES.labels("donor", "out", lease.transport).inc(sum(r[3] for r in results))
        return frames


def _export(lease: Lease, stats: Stats) -> None:
    """Export a worker's counters (direct connections) as the donor's metrics."""
    metrics.INVOCATIONS.labels("donor").inc(stats.invocations)
    metrics.BYTES.labels("donor", "in", lease.transport).inc(stats.bytes_in)
    metrics.BYTES.labels("donor", "out", lease.transport).inc(stats.bytes_out)
    for code, n in stats.errors.items():
        metrics.ERRORS.labels("donor", code).inc(n)
    for _, seconds in stats.calls:
        metrics.LATENCY.labels("donor").observe(seconds)


def _error(lease: int, seq: int, code: Code, message: str, key: bytes) -> Frame:
    meta = handshake.error_body(code.value, message)
    return (Header(Op.ERROR, lease, seq, length=len(meta)).pack(key), meta)


def _worker_entry(
    conn: Connection, arena_path: str, size: int, slots: int, slot_size: int, allow: dict[str, str]
) -> None:
    from remote_gpu import worker

    worker.main(conn, arena_path, size, slots, slot_size, allow)


def _stop_process(proc: BaseProcess) -> None:
    proc.join(2.0)
    if proc.is_alive():
        proc.terminate()
        proc.join(2.0)
    if proc.is_alive():
        proc.kill()
        proc.join()


__all__ = ["VERSION", "Donor", "DonorConfig"]
