"""The shared-memory fast path: request and response rings in the arena, FIFO doorbells.

With the shared-memory transport the client and the lease's worker share the arena
anyway; this module lets them exchange the requests themselves through it as well, so a
call costs neither the donor's event loop nor a socket round trip. The control block
after the arena's slots holds::

    offset                 size                 content
    0                      8                    requests posted (client's counter)
    64                     8                    responses posted (worker's counter)
    128                    8                    the worker may be asleep (its flag)
    192                    8                    the client may be asleep (its flag)
    PAGE                   entries x ENTRY      request ring
    PAGE + entries x ENTRY entries x ENTRY      response ring

An entry is a 4-byte length and the very frames the stream transports would carry for
the message: a head frame, its metadata, one header per array (whose payload lies in the
request's slot, the SHM flag). Every header is MACed with the session key, so the worker
checks a ring entry exactly as it checks a frame from a socket: nothing in the ring is
trusted. Message n goes into entry ``n % entries``; there are as many entries as credits
and a credit comes back with its response, so a well-behaved client never overwrites an
entry the worker has not read (a misbehaving one can only break its own lease).

Doorbells: a side about to sleep raises its flag, looks at the counter again, drains its
own FIFO, looks once more and only then waits in ``poll``; it lowers the flag when it
wakes. After posting, a side writes a byte to the other side's FIFO (never blocking: a
full FIFO already means "wake up") only if the other side's flag is up, so a call costs
no system call while both sides are busy (or spin, ``wait``). No wake-up is
lost: each side stores (the counter; the flag), then a full fence, then loads (the
other's flag; the counter), so at least one of them sees the other's store: either the
sleeper sees the message and does not sleep, or the poster sees the flag and rings.

The counters, flags and entries are plain stores and loads: this relies on the stores
of one process becoming visible to another in program order (x86-64's memory model),
which is why the donor offers the rings only there (``supported``). The fence is a round
trip of a lock, whose atomic read-modify-write instructions (``lock``-prefixed on
x86-64) order every store before them ahead of every load after them.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import select
import struct
import threading
from pathlib import Path
from time import perf_counter as _clock

from remote_gpu.arena import PAGE, Arena
from remote_gpu.errors import FrameError

ENTRY = 8192
# u64 indices, a cache line apart: the counters, then the flags "may be asleep".
_REQUESTS, _RESPONSES, _WORKER_ASLEEP, _CLIENT_ASLEEP = 0, 8, 16, 24
_FENCE = threading.Lock()
_yield = os.sched_yield  # between two looks of a spinning ``wait``
_LENGTH = struct.Struct("<I")


def _fence() -> None:
    """A full memory fence: acquiring and releasing a lock are atomic instructions."""
    _FENCE.acquire()
    _FENCE.release()


def ctl_size(entries: int) -> int:
    return PAGE + 2 * entries * ENTRY


def supported() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


class Ring:
    """One side of a lease's rings: ``side`` is "client" (posts requests) or "worker"."""

    def __init__(self, arena: Arena, entries: int, side: str) -> None:
        if side not in ("client", "worker"):
            raise ValueError(side)
        if arena.ctl_offset + ctl_size(entries) > arena.seal_offset:
            raise ValueError("the arena has no control block for this many entries")
        base = arena.ctl_offset
        self.entries = entries
        self._counters = arena.view(base, 256).cast("Q")
        requests = arena.view(base + PAGE, entries * ENTRY)
        responses = arena.view(base + PAGE + entries * ENTRY, entries * ENTRY)
        req_fifo, rsp_fifo = arena.doorbells()
        if side == "client":
            self._out, self._in = requests, responses
            self._out_i, self._in_i = _REQUESTS, _RESPONSES
            self._asleep, self._peer_asleep = _CLIENT_ASLEEP, _WORKER_ASLEEP
            out_path, in_path = req_fifo, rsp_fifo
        else:
            self._out, self._in = responses, requests
            self._out_i, self._in_i = _RESPONSES, _REQUESTS
            self._asleep, self._peer_asleep = _WORKER_ASLEEP, _CLIENT_ASLEEP
            out_path, in_path = rsp_fifo, req_fifo
        self._out_fd = _open_fifo(out_path)
        try:
            self._in_fd = _open_fifo(in_path)
        except BaseException:
            os.close(self._out_fd)
            raise
        # A fresh arena's counters are zero; the other side may have posted already.
        self.posted = 0
        self.taken = 0

    # ---- sending

    def post(self, message: bytes | list[bytes]) -> None:
        """Write one message (or its chunks) into the next entry, publish it and ring the
        doorbell."""
        data = message if isinstance(message, bytes) else b"".join(message)
        size = len(data)
        if size + 4 > ENTRY:
            raise FrameError(f"a {size}-byte message does not fit a {ENTRY}-byte ring entry")
        at = self.posted % self.entries * ENTRY
        out = self._out
        _LENGTH.pack_into(out, at, size)
        out[at + 4 : at + 4 + size] = data
        self.posted += 1
        counters = self._counters
        counters[self._out_i] = self.posted
        _FENCE.acquire()  # see the module docstring: no wake-up is lost
        _FENCE.release()
        if counters[self._peer_asleep]:
            with contextlib.suppress(BlockingIOError):
                os.write(self._out_fd, b"\0")

    # ---- receiving

    def ready(self) -> bool:
        return bool(self._counters[self._in_i] != self.taken)

    def take(self) -> bytes:
        """The next message (call only when ``ready()``)."""
        at = self.taken % self.entries * ENTRY
        (size,) = _LENGTH.unpack_from(self._in, at)
        if size > ENTRY - 4:
            raise FrameError(f"ring entry claims {size} bytes")
        self.taken += 1
        return bytes(self._in[at + 4 : at + 4 + size])

    def wait(self, timeout: float | None, *others: int, spin: float = 0.0) -> list[int]:
        """Sleep until a message is ready or one of ``others`` is readable.

        With ``spin``, first watch the counter for up to that many seconds: a message
        that comes meanwhile costs neither side a wake-up (which, between the vCPUs of a
        virtual machine, can cost the waker tens of microseconds, and on a busy machine
        a wait for a CPU). Between two looks the spinner yields its CPU
        (``sched_yield``), so that whoever else wants it, maybe the peer, runs first: on
        an idle CPU a look costs a microsecond, on a busy one the spinner only waits its
        turn. Returns the readable ``others``; an empty list means a message may be
        ready (or the time ran out: check ``ready()``).
        """
        if self.ready():
            return []
        if spin > 0:
            until = _clock() + spin
            counters, i, taken = self._counters, self._in_i, self.taken
            while True:
                if counters[i] != taken:
                    return []
                if _clock() >= until:
                    break
                _yield()
        counters = self._counters
        counters[self._asleep] = 1
        try:
            _fence()
            if self.ready():
                return []
            self._drain()
            if self.ready():
                return []
            poller = select.poll()
            poller.register(self._in_fd, select.POLLIN)
            for fd in others:
                poller.register(fd, select.POLLIN)
            ms = None if timeout is None else max(0, math.ceil(timeout * 1000))
            return [fd for fd, _ in poller.poll(ms) if fd != self._in_fd]
        finally:
            counters[self._asleep] = 0

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._in_fd, 4096):
                pass

    def close(self) -> None:
        for view in (self._out, self._in, self._counters):
            view.release()  # the arena's mapping can go once no view is left
        for fd in (self._out_fd, self._in_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def _open_fifo(path: Path) -> int:
    # Read-write so that opening never blocks and a write never fails for want of a
    # reader; liveness comes from the lease's control channel and the donor's pipe.
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not _is_fifo(fd):
        os.close(fd)
        raise FrameError(f"{path} is not a FIFO")
    return fd


def _is_fifo(fd: int) -> bool:
    import stat

    return stat.S_ISFIFO(os.fstat(fd).st_mode)
