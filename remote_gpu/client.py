"""The client library: :class:`RemoteGPU`.

``RemoteGPU.from_env()`` reads what the CDI spec injects into the pod:
``REMOTE_GPU_ENDPOINT`` (``host:port``, or ``ucx://host:port``), ``REMOTE_GPU_TOKEN_FILE``,
optionally ``REMOTE_GPU_LEASE`` (checked against the token) and ``REMOTE_GPU_TRANSPORT``
(``auto``, ``shm``, ``tcp`` or ``ucx``). ``invoke(name, *arrays)`` runs an allow-listed
function on the donor and returns its result arrays; ``submit`` does the same without
waiting, up to the credits the donor granted.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import secrets
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from composable_dra import logs
from remote_gpu import metrics
from remote_gpu.arena import Arena, align
from remote_gpu.errors import FrameError, RemoteGPUError, from_code
from remote_gpu.protocol import (
    HELLO_KEY,
    MAX_META,
    VERSION,
    DType,
    Flags,
    Header,
    Op,
    dtype_code,
    session_key,
    unpack,
)
from remote_gpu.tokens import Token, read
from remote_gpu.transports import ClientTransport, Frame, host_id

log = logs.get(__name__)

Result = tuple[np.ndarray, ...]


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
        versions: tuple[int, ...] = (VERSION,),
        timeout: float = 30.0,
    ) -> None:
        self.lease = token.lease
        self.timeout = timeout
        self._tr = _connect(endpoint, timeout)
        self._seq = itertools.count(1)
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[Future[Result], float, int | None]] = {}
        self._closed = False
        self._failure: BaseException | None = None
        self.arena: Arena | None = None
        try:
            self._hello(token, transport, credits, frame_bytes, target_rate, versions)
        except BaseException:
            self._tr.close()
            raise
        self._credits = threading.BoundedSemaphore(self.credits)
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(self.credits):
            self._slots.put(i)
        self._receiver = threading.Thread(
            target=self._receive_loop, daemon=True, name=f"remote-gpu-{self.lease}"
        )
        self._receiver.start()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> RemoteGPU:
        env = os.environ if env is None else env
        try:
            endpoint = env["REMOTE_GPU_ENDPOINT"]
            token_path = Path(env["REMOTE_GPU_TOKEN_FILE"])
        except KeyError as exc:
            raise RemoteGPUError(f"{exc.args[0]} is not set") from None
        token = read(token_path)
        lease = env.get("REMOTE_GPU_LEASE")
        if lease is not None and int(lease) != token.lease:
            raise RemoteGPUError("REMOTE_GPU_LEASE does not match the token's lease")
        kwargs.setdefault("transport", env.get("REMOTE_GPU_TRANSPORT", "auto"))
        return cls(endpoint, token, **kwargs)

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
        nonce = secrets.token_bytes(16)
        meta = json.dumps(
            {
                "versions": list(versions),
                "token": token.to_json(),
                "nonce": nonce.hex(),
                "transport": transport,
                "host": host_id(),
                "credits": credits,
                "frame_bytes": frame_bytes,
                "target_rate": target_rate,
            }
        ).encode()
        head = Header(Op.HELLO, token.lease, 0, version=max(versions), length=len(meta))
        self._tr.send_frames([(head.pack(HELLO_KEY), meta)])
        reply = unpack(self._tr.recv_header(), HELLO_KEY, MAX_META)
        body = json.loads(self._recv_meta(reply))
        if reply.op == Op.ERROR:
            raise from_code(body.get("code", ""), body.get("message", ""))
        if reply.op != Op.HELLO:
            raise FrameError(f"donor answered HELLO with {reply.op.name}")
        self.version = int(body["version"])
        self.donor = str(body["donor"])
        self.credits = int(body["credits"])
        self.slot_size = int(body["slot_size"])
        self.transport = str(body["transport"])
        self.functions = list(body.get("functions", []))
        if transport != "auto" and self.transport != transport:
            raise RemoteGPUError(f"donor cannot use transport {transport!r} for this client")
        if self.transport == "shm":
            self.arena = Arena.attach(body["arena"], int(body["arena_size"]), self.credits)
        self._key = session_key(token.mac_bytes, nonce, bytes.fromhex(body["nonce"]))
        log.info(
            "lease connected",
            lease=self.lease,
            donor=self.donor,
            transport=self.transport,
            credits=self.credits,
        )

    def _recv_meta(self, header: Header) -> bytes:
        buf = bytearray(header.length)
        self._tr.recv_payload_into(memoryview(buf))
        return bytes(buf)

    # ---- calls

    def submit(self, name: str, *arrays: np.ndarray) -> Future[Result]:
        if self._failure is not None:
            raise self._failure
        arrs = [
            a if a.flags.c_contiguous else np.array(a, order="C") for a in map(np.asarray, arrays)
        ]
        for a in arrs:
            dtype_code(a.dtype)
        need = sum(align(a.nbytes) for a in arrs)
        if need > self.slot_size:
            from remote_gpu.errors import MemoryQuotaExceeded

            raise MemoryQuotaExceeded(
                f"arguments of {need} bytes exceed the lease's {self.slot_size}-byte slot"
            )
        if not self._credits.acquire(timeout=self.timeout):
            raise TimeoutError("no credit came back from the donor in time")
        slot = self._slots.get() if self.arena is not None else None
        fut: Future[Result] = Future()
        try:
            with self._send_lock:
                seq = next(self._seq) & 0xFFFFFFFF
                self._pending[seq] = (fut, time.perf_counter(), slot)
                self._tr.send_frames(self._invoke_frames(seq, slot, name, arrs))
        except BaseException as exc:
            self._pending.pop(seq, None)
            self._release(slot)
            self._fail(exc)
            raise
        metrics.BYTES.labels("client", "out", self.transport).inc(sum(a.nbytes for a in arrs))
        return fut

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        return self.submit(name, *arrays).result(self.timeout)

    def _invoke_frames(
        self, seq: int, slot: int | None, name: str, arrs: list[np.ndarray]
    ) -> list[Frame]:
        meta = name.encode()
        base = 0 if slot is None or self.arena is None else self.arena.slot_base(slot)
        head = Header(Op.INVOKE, self.lease, seq, parts=len(arrs), offset=base, length=len(meta))
        frames: list[Frame] = [(head.pack(self._key), meta)]
        cursor = base
        for i, a in enumerate(arrs, start=1):
            shape = tuple(int(d) for d in a.shape)
            code = dtype_code(a.dtype)
            if self.arena is not None:
                np.copyto(self.arena.array(cursor, code, shape), a, casting="no")
                h = Header(
                    Op.INVOKE,
                    self.lease,
                    seq,
                    flags=Flags.SHM,
                    dtype=code,
                    part=i,
                    parts=len(arrs),
                    shape=shape,
                    offset=cursor,
                    length=a.nbytes,
                )
                frames.append((h.pack(self._key), None))
                cursor = align(cursor + a.nbytes)
            else:
                h = Header(
                    Op.INVOKE,
                    self.lease,
                    seq,
                    dtype=code,
                    part=i,
                    parts=len(arrs),
                    shape=shape,
                    length=a.nbytes,
                )
                frames.append((h.pack(self._key), _bytes_of(a)))
        return frames

    def heartbeat(self) -> float:
        """Round trip of a HEARTBEAT, in seconds."""
        fut: Future[Result] = Future()
        start = time.perf_counter()
        with self._send_lock:
            seq = next(self._seq) & 0xFFFFFFFF
            self._pending[seq] = (fut, start, None)
            self._tr.send_frames([(Header(Op.HEARTBEAT, self.lease, seq).pack(self._key), None)])
        fut.result(self.timeout)
        return time.perf_counter() - start

    # ---- replies

    def _release(self, slot: int | None) -> None:
        if slot is not None:
            self._slots.put(slot)

    def _receive_loop(self) -> None:
        try:
            while True:
                head = unpack(self._tr.recv_header(), self._key, MAX_META)
                meta = self._recv_meta(head)
                arrays = [self._recv_array(head) for _ in range(head.parts)]
                entry = self._pending.pop(head.seq, None)
                if entry is None:
                    if head.op == Op.ERROR:
                        body = json.loads(meta)
                        raise from_code(body.get("code", ""), body.get("message", ""))
                    continue
                fut, start, slot = entry
                if head.op == Op.HEARTBEAT:
                    fut.set_result(())
                    continue
                self._release(slot)
                self._credits.release()
                if head.op == Op.RESULT:
                    metrics.LATENCY.labels("client").observe(time.perf_counter() - start)
                    metrics.INVOCATIONS.labels("client").inc()
                    metrics.BYTES.labels("client", "in", self.transport).inc(
                        sum(a.nbytes for a in arrays)
                    )
                    fut.set_result(tuple(arrays))
                elif head.op == Op.ERROR:
                    body = json.loads(meta)
                    err = from_code(body.get("code", ""), body.get("message", ""))
                    metrics.ERRORS.labels("client", err.code.value).inc()
                    fut.set_exception(err)
                else:
                    raise FrameError(f"unexpected {head.op.name} from the donor")
        except BaseException as exc:
            if not self._closed:
                self._fail(exc)
            else:
                self._fail(RemoteGPUError("client closed"))

    def _recv_array(self, head: Header) -> np.ndarray:
        h = unpack(self._tr.recv_header(), self._key, 1 << 40)
        if h.seq != head.seq or h.part == 0 or h.op != head.op:
            raise FrameError("array frame out of sequence")
        if h.flags & Flags.SHM:
            if self.arena is None or h.offset + h.length > self.arena.size:
                raise FrameError("SHM result outside the arena")
            return self.arena.array(h.offset, h.dtype, h.shape).copy()
        from remote_gpu.protocol import numpy_dtype

        out = np.empty(h.shape, dtype=numpy_dtype(h.dtype))
        if h.length:
            self._tr.recv_payload_into(_bytes_of(out))
        return out

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = (
                exc
                if isinstance(exc, RemoteGPUError)
                else RemoteGPUError(f"connection lost: {exc!r}")
            )
        for fut, _, _ in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(self._failure)
        self._pending.clear()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception), self._send_lock:
            self._tr.send_frames([(Header(Op.CLOSE, self.lease, 0).pack(self._key), None)])
        self._tr.close()
        self._receiver.join(self.timeout)
        if self.arena is not None:
            self.arena.close()

    def __enter__(self) -> RemoteGPU:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DType", "RemoteGPU"]
