"""Plain TCP: scatter-gather ``sendmsg`` out, ``recv_into`` in; no intermediate copies."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence

from remote_gpu.errors import DeadlineExceeded
from remote_gpu.protocol import HEADER_SIZE
from remote_gpu.transports import Buffer, ClientTransport, Frame, ServerTransport, pieces

_IOV_MAX = 512


def _advance(bufs: list[memoryview], sent: int) -> list[memoryview]:
    while sent:
        n = len(bufs[0])
        if sent >= n:
            sent -= n
            bufs.pop(0)
        else:
            bufs[0] = bufs[0][sent:]
            sent = 0
    return bufs


def send_all(sock: socket.socket, frames: Sequence[Frame]) -> None:
    """Send frames on a blocking socket with scatter-gather ``sendmsg``: no joined copy."""
    bufs = pieces(frames)
    while bufs:
        sent = sock.sendmsg(bufs[:_IOV_MAX])
        bufs = _advance(bufs, sent)


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from a blocking socket (``recv_into``, no intermediate buffer)."""
    got, want = 0, len(view)
    while got < want:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


class Reader:
    """Buffered reads from a blocking socket: small frames (headers, metadata, doorbells)
    come out of one ``recv_into`` of whatever is available; large payloads go straight
    from the socket into their destination."""

    def __init__(self, sock: socket.socket, size: int = 64 << 10) -> None:
        self.sock = sock
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    def buffered(self) -> int:
        return self._end - self._start

    def fill_nowait(self) -> bool:
        """Whether bytes are at hand: buffered, or read now without waiting."""
        if self._end > self._start:
            return True
        self._start = self._end = 0
        try:
            n = self.sock.recv_into(self._view, 0, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        if n == 0:
            raise ConnectionError("peer closed the connection")
        self._end = n
        return True

    def spin(self, seconds: float) -> bool:
        """Look for bytes for up to ``seconds`` without sleeping, yielding the CPU between
        looks (as ``Ring.wait`` does): a reply or request that comes meanwhile costs
        neither side a wake-up, which between the vCPUs of a virtual machine costs tens
        of microseconds (sequential 4 KiB calls went from ~5,100 to ~8,300 a second on
        the development machine with both sides spinning)."""
        if self.fill_nowait():
            return True
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            os.sched_yield()
            if self.fill_nowait():
                return True
        return False

    def read_into(self, dst: memoryview) -> None:
        want = len(dst)
        have = self._end - self._start
        if have >= want:
            dst[:] = self._view[self._start : self._start + want]
            self._start += want
            return
        if have:
            dst[:have] = self._view[self._start : self._end]
        self._start = self._end = 0
        if want - have >= len(self._buf) // 2:
            recv_exact(self.sock, dst[have:])
            return
        got = have
        while got < want:
            n = self.sock.recv_into(self._view[self._end :])
            if n == 0:
                raise ConnectionError("peer closed the connection")
            self._end += n
            take = min(want - got, self._end - self._start)
            dst[got : got + take] = self._view[self._start : self._start + take]
            self._start += take
            got += take

    def read(self, n: int) -> bytes:
        if self._end - self._start >= n:
            out = bytes(self._view[self._start : self._start + n])
            self._start += n
            return out
        buf = bytearray(n)
        self.read_into(memoryview(buf))
        return bytes(buf)


def tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)


def _timeval(seconds: float) -> bytes:
    """A ``struct timeval`` of ``seconds`` (at least 1 us: zero would mean no timeout)."""
    whole, micros = divmod(max(1, round(seconds * 1e6)), 1_000_000)
    return struct.pack("@ll", whole, micros)


class TcpClientTransport(ClientTransport):
    """Every wait is bounded by ``timeout``: reads by the kernel (``SO_RCVTIMEO``: no
    system call added per read), waits for room to send by ``poll``; either raises
    :class:`DeadlineExceeded` once the donor has been silent (or not reading) that long."""

    name = "tcp"

    def __init__(self, host: str, port: int, timeout: float | None = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        tune(self.sock)
        self.sock.settimeout(None)
        self._ms: int | None = None
        if timeout is not None:
            self._ms = max(1, math.ceil(timeout * 1000))
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
        self._reader = Reader(self.sock)
        self._poll = select.poll()
        self._poll.register(self.sock.fileno(), select.POLLIN)
        self._poll_out = select.poll()
        self._poll_out.register(self.sock.fileno(), select.POLLOUT)
        self._poll_both = select.poll()
        self._poll_both.register(self.sock.fileno(), select.POLLIN | select.POLLOUT)

    def send_frames(self, frames: Sequence[Frame], drain: Callable[[], bool] | None = None) -> None:
        """Send; while the socket is full, let ``drain`` read replies (if it can), so that
        a peer blocked sending us replies cannot block us in turn."""
        bufs = pieces(frames)
        while bufs:
            try:
                sent = self.sock.sendmsg(bufs[:_IOV_MAX], [], socket.MSG_DONTWAIT)
            except BlockingIOError:
                if drain is None:
                    self._wait_writable()
                    continue
                events = self._poll_both.poll(self._ms)
                if any(ev & select.POLLOUT for _, ev in events):
                    continue
                if not events:
                    raise DeadlineExceeded("the donor has not read what was sent in time") from None
                if not drain():
                    self._wait_writable()
                continue
            bufs = _advance(bufs, sent)

    def _wait_writable(self) -> None:
        if not self._poll_out.poll(self._ms):
            raise DeadlineExceeded("the donor has not read what was sent in time")

    def recv_into(self, view: memoryview) -> None:
        try:
            self._reader.read_into(view)
        except BlockingIOError:  # SO_RCVTIMEO ran out
            raise DeadlineExceeded("the donor stopped sending mid-frame") from None

    def recv_header(self) -> bytes:
        try:
            return self._reader.read(HEADER_SIZE)
        except BlockingIOError:
            raise DeadlineExceeded("the donor stopped sending mid-frame") from None

    def fileno(self) -> int | None:
        return self.sock.fileno()

    def buffered(self) -> bool:
        return self._reader.buffered() > 0

    def wait_readable(self, timeout: float | None, spin: float = 0.0) -> bool:
        if self._reader.spin(min(spin, timeout) if timeout is not None else spin):
            return True
        ms = None if timeout is None else max(0, int(timeout * 1000))
        return bool(self._poll.poll(ms))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class TcpServerTransport(ServerTransport):
    name = "tcp"

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        tune(sock)
        try:
            host, port = sock.getpeername()[:2]
            self.peer = f"{host}:{port}"
        except OSError:
            self.peer = "?"
        self._loop = asyncio.get_running_loop()

    async def _writable(self) -> None:
        fut: asyncio.Future[None] = self._loop.create_future()
        fd = self.sock.fileno()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        self._loop.add_writer(fd, wake)
        try:
            await fut
        finally:
            self._loop.remove_writer(fd)

    async def send_frames(self, frames: Sequence[Frame]) -> None:
        bufs = pieces(frames)
        while bufs:
            try:
                sent = self.sock.sendmsg(bufs[:_IOV_MAX])
            except BlockingIOError:
                await self._writable()
                continue
            bufs = _advance(bufs, sent)

    async def recv_into(self, view: memoryview) -> None:
        got, want = 0, len(view)
        while got < want:
            try:
                n = self.sock.recv_into(view[got:])
            except BlockingIOError:
                n = await self._loop.sock_recv_into(self.sock, view[got:])
            if n == 0:
                raise ConnectionError("peer closed the connection")
            got += n

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def detach(self) -> int:
        """Give up the socket without shutting the connection down (it was handed over)."""
        return self.sock.detach()


def payload(buf: Buffer) -> memoryview:
    return memoryview(buf).cast("B")
