"""A lease that outlives its connection: :class:`ReconnectingGPU`.

A donor that restarts (same node, same device, a new process) loses its leases and ends
their connections. The lease controller opens the lease again for the same allocation,
and the consumer's plugin writes the new lease's token and endpoint into the lease's
directory, which the container has mounted (``composable_dra.model.remote_env``). This
client then connects again on its own: when its connection is lost, the next call (or the
one that saw it go) re-reads the directory and connects, retrying after the suite's retry
policy's waits (``composable_dra.k8s.retry.bounded``) until it succeeds or ``within``
seconds have passed (then :class:`ReconnectFailed`). So a pod rides out a restart in
about the time the donor takes to come back, plus the controller's resync, the plugin's
refresh interval and one wait of the policy (at most ``RECONNECT_CAP``).

A call in flight when the connection is lost may or may not have run on the donor. It
is run again on the new connection only if the donor declared its function idempotent
(``remote_gpu.idempotency``: the ACCEPT's ``idempotent`` names); otherwise it fails with
:class:`CallInterrupted` and the caller decides. A deadline on a live connection, or the
function's own error, is the caller's as before: neither says the connection was lost.

``submit`` hands the call to the current connection (reconnecting first if it is lost)
and is not retried: its future fails with the connection's error.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from composable_dra.k8s import retry
from composable_dra.model import remote_env
from composable_dra.process import logs
from remote_gpu import metrics
from remote_gpu.client import RemoteGPU, Result, env_leases, open_each
from remote_gpu.errors import CallInterrupted, ReconnectFailed, RemoteGPUError, VersionError

log = logs.get(__name__)

# The longest wait between two tries to connect: how late a donor that is back may be
# noticed.
RECONNECT_CAP = 1.0
RECONNECT_FIRST = 0.05
RECONNECT_WITHIN = 60.0


class _Lost(Exception):
    """An idempotent call whose connection was lost: run it again."""

    def __init__(self, cause: RemoteGPUError) -> None:
        super().__init__(cause.message)
        self.cause = cause


def may_retry(name: str, idempotent: frozenset[str]) -> bool:
    """Whether a call of ``name`` lost with its connection may run again."""
    return name in idempotent


def reconnectable(exc: BaseException) -> bool:
    """A failure to connect worth another try: the donor not (yet) back, or the lease's
    files not (yet) the re-opened lease's. A version mismatch will not mend."""
    return isinstance(exc, OSError | RemoteGPUError) and not isinstance(exc, VersionError)


class ReconnectingGPU:
    """A ``RemoteGPU`` made again by ``connect`` whenever its connection is lost."""

    def __init__(self, connect: Callable[[], RemoteGPU], within: float = RECONNECT_WITHIN) -> None:
        self._connect = connect
        self.within = within
        self.reconnects = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # The first connection is tried once: a lease that never worked (a wrong token,
        # no such donor) is the caller's to hear of at once.
        self._gpu: RemoteGPU | None = connect()
        # The current connection's: its lease (a re-opened lease has a new id) and transport.
        self.lease, self.transport = self._gpu.lease, self._gpu.transport

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, within: float = RECONNECT_WITHIN, **kwargs: Any
    ) -> ReconnectingGPU:
        """The container's (first) lease, as ``RemoteGPU.from_env`` reads it, each time."""
        env = dict(os.environ if env is None else env)
        names = remote_env.names(None)
        return cls(lambda: RemoteGPU._from_vars(env, names, **kwargs), within)

    @classmethod
    def all_from_env(
        cls, env: Mapping[str, str] | None = None, within: float = RECONNECT_WITHIN, **kwargs: Any
    ) -> list[ReconnectingGPU]:
        """Every lease of the container's claim, as ``RemoteGPU.all_from_env`` finds them."""
        env = dict(os.environ if env is None else env)

        def one(names: remote_env.LeaseVars) -> ReconnectingGPU:
            return cls(lambda: RemoteGPU._from_vars(env, names, **kwargs), within)

        return open_each(one, env_leases(env))

    # ---- the connection

    def _connection(self, seconds: float | None = None) -> RemoteGPU:
        """The live connection; a new one if it was lost (ReconnectFailed after
        ``seconds``, default ``within``, of tries)."""
        seconds = self.within if seconds is None else max(seconds, RECONNECT_FIRST)
        with self._lock:
            gpu = self._gpu
            if gpu is not None and not gpu.failed:
                return gpu
            if gpu is not None:
                with contextlib.suppress(Exception):
                    gpu.close()
            self._gpu = None
            try:
                fresh = retry.bounded(
                    self._connect,
                    self._stop,
                    within=seconds,
                    retryable=reconnectable,
                    cap=RECONNECT_CAP,
                    first=RECONNECT_FIRST,
                )
            except (OSError, RemoteGPUError) as exc:
                if gpu is not None:
                    metrics.RECONNECTS.labels("failed").inc()
                raise ReconnectFailed(
                    f"no connection to the lease within {self.within:g} s: {exc}"
                ) from exc
            self._gpu = fresh
            self.lease, self.transport = fresh.lease, fresh.transport
            if gpu is not None:
                self.reconnects += 1
                metrics.RECONNECTS.labels("ok").inc()
                log.info("lease reconnected", lease=fresh.lease, was=gpu.lease)
            return fresh

    @property
    def gpu(self) -> RemoteGPU:
        """The current connection (maybe lost: calls reconnect, reading this does not)."""
        assert self._gpu is not None
        return self._gpu

    # ---- calls

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        """``RemoteGPU.invoke`` on the live connection; a call lost with its connection
        runs again on the next one if its function is idempotent, else CallInterrupted.
        Connecting again takes at most ``within`` seconds in all, however often the
        connection is lost meanwhile (then ReconnectFailed)."""
        deadline = time.monotonic() + self.within
        try:
            return retry.bounded(
                lambda: self._call(name, arrays, deadline),
                self._stop,
                within=self.within,
                retryable=lambda exc: isinstance(exc, _Lost),
                cap=RECONNECT_CAP,
                first=RECONNECT_FIRST,
            )
        except _Lost as lost:
            raise ReconnectFailed(
                f"{name}: the connection was lost again and again for {self.within:g} s"
            ) from lost.cause

    def _call(self, name: str, arrays: tuple[np.ndarray, ...], deadline: float) -> Result:
        gpu = self._connection(deadline - time.monotonic())
        try:
            return gpu.invoke(name, *arrays)
        except RemoteGPUError as exc:
            if not gpu.failed:
                raise  # the function's own error, or a deadline: not a lost connection
            if may_retry(name, gpu.idempotent):
                metrics.CALLS_LOST.labels("retried").inc()
                raise _Lost(exc) from exc
            metrics.CALLS_LOST.labels("failed").inc()
            raise CallInterrupted(
                f"{name}: the connection to lease {gpu.lease} was lost during the call "
                f"({exc.message}); it may have run, and is not declared idempotent"
            ) from exc

    def submit(self, name: str, *arrays: np.ndarray) -> Future[Result]:
        return self._connection().submit(name, *arrays)

    def heartbeat(self) -> float:
        return self._connection().heartbeat()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._gpu is not None:
                self._gpu.close()

    def __enter__(self) -> ReconnectingGPU:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
