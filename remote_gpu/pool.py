"""Several leases as one: :class:`RemoteGPUPool` spreads calls over a pod's remote GPUs.

A claim for several remote devices gives the container one lease each
(``composable_dra.model.remote_env``); ``RemoteGPUPool.from_env()`` opens them all
(``ReconnectingGPU.all_from_env``: each lease connects again on its own after its donor
restarted, ``remote_gpu.reconnect``). Each call goes to the lease with the fewest calls in flight
(ties taken in turn), at most ``per_lease`` in flight on each: a lease is never queued
deeper than its credits, and a slow lease gets fewer calls. ``submit`` waits for a free
place (``DeadlineExceeded`` after ``timeout``); ``map`` yields results in call order, or
as they complete with ``ordered=False``.

Calls run on the pool's threads, each an ``invoke`` on its lease: a ``RemoteGPU`` future
completes only while a thread waits on it, and socket reads let go of the GIL, so one
thread per place in flight keeps every lease busy at once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from remote_gpu.client import Result
from remote_gpu.errors import DeadlineExceeded
from remote_gpu.reconnect import RECONNECT_WITHIN, ReconnectingGPU


class Lease(Protocol):
    """What the pool needs of a lease (a ``ReconnectingGPU`` or a ``RemoteGPU``)."""

    @property
    def lease(self) -> int: ...

    def invoke(self, name: str, *arrays: np.ndarray) -> Result: ...

    def close(self) -> None: ...


def pick(in_flight: Sequence[int], bound: int, start: int) -> int | None:
    """The lease for the next call: fewest in flight below ``bound``, ties from ``start``
    on (round robin); None when every lease is at the bound."""
    n = len(in_flight)
    order = [(start + k) % n for k in range(n)]
    free = [i for i in order if in_flight[i] < bound]
    return min(free, key=lambda i: in_flight[i]) if free else None


class RemoteGPUPool:
    def __init__(
        self,
        gpus: Sequence[Lease],
        per_lease: int = 2,
        timeout: float = 30.0,
        owns: bool = True,
    ) -> None:
        """``owns=False``: ``close`` leaves the leases open (a pool over some of a pod's
        leases, as a scale-out sweep makes one per count)."""
        if not gpus or per_lease < 1:
            raise ValueError("a pool needs at least one lease and one call in flight on each")
        self.gpus = list(gpus)
        self.per_lease = per_lease
        self.timeout = timeout
        self.owns = owns
        self._in_flight = [0] * len(self.gpus)
        self._calls = [0] * len(self.gpus)
        self._next = 0
        self._free = threading.Condition()
        self._threads = concurrent.futures.ThreadPoolExecutor(
            per_lease * len(self.gpus), thread_name_prefix="remote-gpu-pool"
        )

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        per_lease: int = 2,
        within: float = RECONNECT_WITHIN,
        **kwargs: Any,
    ) -> RemoteGPUPool:
        """Every lease the container's env describes, opened (``RemoteGPU`` keywords in
        ``kwargs``), each reconnecting within ``within`` seconds: a call's wait allows
        for that too."""
        gpus = ReconnectingGPU.all_from_env(env, within, **kwargs)
        return cls(gpus, per_lease, kwargs.get("timeout", 30.0) + within)

    @property
    def leases(self) -> list[int]:
        return [g.lease for g in self.gpus]

    def calls_by_lease(self) -> dict[int, int]:
        """Calls each lease was given so far."""
        with self._free:
            return {g.lease: n for g, n in zip(self.gpus, self._calls, strict=True)}

    def _take(self) -> int:
        with self._free:
            i = pick(self._in_flight, self.per_lease, self._next)
            if i is None:
                self._free.wait_for(
                    lambda: min(self._in_flight) < self.per_lease, timeout=self.timeout
                )
                i = pick(self._in_flight, self.per_lease, self._next)
            if i is None:
                raise DeadlineExceeded(f"every lease has {self.per_lease} calls in flight")
            self._in_flight[i] += 1
            self._calls[i] += 1
            self._next = (i + 1) % len(self.gpus)
            return i

    def _run(self, i: int, name: str, arrays: tuple[np.ndarray, ...]) -> Result:
        try:
            return self.gpus[i].invoke(name, *arrays)
        finally:
            with self._free:
                self._in_flight[i] -= 1
                self._free.notify()

    def submit(self, name: str, *arrays: np.ndarray) -> Future[Result]:
        """Run ``name`` on the least busy lease; waits while every lease is full."""
        i = self._take()
        try:
            return self._threads.submit(self._run, i, name, arrays)
        except BaseException:
            with self._free:
                self._in_flight[i] -= 1
                self._free.notify()
            raise

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        return self.submit(name, *arrays).result(self.timeout)

    def map(
        self, name: str, calls: Iterable[Sequence[np.ndarray]], ordered: bool = True
    ) -> Iterator[Result]:
        """``name`` over each argument tuple of ``calls``, spread over the leases; results
        in call order (or as completed). At most twice the pool's places are pending, so
        a slow first call holds back no more than that."""
        window = 2 * self.per_lease * len(self.gpus)
        pending: collections.deque[Future[Result]] = collections.deque()
        for args in calls:
            pending.append(self.submit(name, *args))
            if len(pending) >= window:
                yield from self._take_results(pending, ordered, len(pending) - window + 1)
        yield from self._take_results(pending, ordered, len(pending))

    def _take_results(
        self, pending: collections.deque[Future[Result]], ordered: bool, count: int
    ) -> Iterator[Result]:
        for _ in range(count):
            if ordered:
                yield pending.popleft().result(self.timeout)
                continue
            done, _ = concurrent.futures.wait(
                pending, self.timeout, concurrent.futures.FIRST_COMPLETED
            )
            if not done:
                raise DeadlineExceeded("no call of the pool completed in time")
            fut = next(f for f in pending if f in done)
            pending.remove(fut)
            yield fut.result(0)

    def close(self) -> None:
        """Wait for the calls in flight, then close every lease the pool owns."""
        self._threads.shutdown(wait=True)
        for g in self.gpus if self.owns else ():
            g.close()

    def __enter__(self) -> RemoteGPUPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
