"""The shared-memory ceiling: a raw ping-pong through a lease's arena, no protocol.

The same copies as the shared-memory transport with results copied out (``views=False``):
the caller's array is copied into a slot of an :class:`~remote_gpu.arena.Arena` of the
same geometry, the peer process (the worker's stand-in) sees the request and answers it
in place, as ``echo`` does, and the result is copied out of the slot into a new array.
What is left out is everything the transport adds: frames, MACs, futures, doorbells.
Requests and answers are two counters in the arena's control block (x86-64 orders plain
stores, as ``remote_gpu.ring`` relies on too); both sides poll them, yielding the CPU
between looks, so that on a busy machine neither starves the other. The peer polls only
while a measurement runs (``rate`` tells it how many requests to answer); between
measurements it sleeps on its pipe.

A library of ``hack/bench/remote_gpu.py``, not a benchmark of its own: that bench compares
the transport with this ceiling (``shm_vs_pingpong_1mib``), prints the goals, ends with its
JSON and exits non-zero when a goal is missed.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from multiprocessing.connection import Connection

import numpy as np

from hack.bench import placement
from remote_gpu.arena import PAGE, Arena

_POSTED, _ANSWERED = 0, 8  # u64 indices, a cache line apart


def _peer(
    path: str,
    size: int,
    slots: int,
    slot_size: int,
    conn: Connection,
    bench: Connection,
    parent: int,
) -> None:
    bench.close()  # the bench's end, inherited by fork: held here, it would hide its death
    # ``parent``: the bench's pid, as it gave it. Read here with getppid, it would be init's
    # where the bench had already exited (it may, once ready), and the peer would spin on.
    arena = Arena.attach(path, size, slots, slot_size)
    counters = arena.view(arena.ctl_offset, 256).cast("Q")
    conn.send(True)
    answered = idle = 0
    try:
        while True:
            # Between measurements the peer sleeps on the pipe: a spinner left running
            # would take a CPU from everything else the bench measures.
            try:
                until = conn.recv()
            except (EOFError, OSError):
                break
            if until is None:
                break
            while answered < until:
                posted = counters[_POSTED]
                if posted == answered:
                    os.sched_yield()
                    idle += 1
                    if idle % 64 == 0 and os.getppid() != parent:
                        return  # the bench died mid-measurement: spin no longer
                    continue
                answered = posted  # echo: the arguments are the results, in place
                counters[_ANSWERED] = answered
    finally:
        counters.release()
        arena.close()


class PingPong:
    """A peer process and an arena of ``slots`` slots within ``quota`` bytes."""

    def __init__(self, quota: int, slots: int) -> None:
        self.arena = Arena.create(quota, slots, ctl_size=PAGE)
        self.slots = slots
        self._counters = self.arena.view(self.arena.ctl_offset, 256).cast("Q")
        a = self.arena
        mine, theirs = mp.Pipe()
        self._proc = mp.get_context("fork").Process(
            target=_peer,
            args=(str(a.path), a.size, a.slots, a.slot_size, theirs, mine, os.getpid()),
            daemon=True,
        )
        self._proc.start()
        placement.place_server(self._proc.pid or 0)
        theirs.close()
        self._conn = mine
        if not mine.poll(30):
            self.close()
            raise RuntimeError("the ping-pong peer did not start")
        mine.recv()
        self._posted = 0
        self.last = np.empty(0, np.uint8)  # the latest result copied out

    def _wait(self, answered: int) -> None:
        counters = self._counters
        while counters[_ANSWERED] < answered:
            os.sched_yield()

    def rate(self, data: np.ndarray, n: int, depth: int) -> float:
        """Bytes per second of ``n`` round trips of ``data`` with ``depth`` in flight."""
        size = data.nbytes
        if size > self.arena.slot_size or not 1 <= depth <= self.slots:
            raise ValueError(f"{size} bytes, {depth} in flight: no fit for {self.slots} slots")
        src = data.reshape(-1).view(np.uint8)
        buf, slot_size, counters = self.arena.buf, self.arena.slot_size, self._counters
        taken = self._posted
        self._conn.send(self._posted + n)  # the peer answers that many, then sleeps
        start = time.perf_counter()
        for i in range(n + depth):
            if self._posted - taken == depth or (i >= n and taken < self._posted):
                # The oldest request's result, copied out as a caller gets it.
                taken += 1
                self._wait(taken)
                at = (taken - 1) % self.slots * slot_size
                self.last = np.empty(size, np.uint8)
                np.copyto(self.last, buf[at : at + size])
            if i < n:
                at = self._posted % self.slots * slot_size
                np.copyto(buf[at : at + size], src)
                self._posted += 1
                counters[_POSTED] = self._posted
        return n * size / (time.perf_counter() - start)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._proc.join(10)
        self._counters.release()
        self.arena.close()
