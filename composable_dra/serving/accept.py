"""An accept loop that holds the process's connection budget and never stops on a
failing ``accept`` (out of descriptors or memory): it backs off and tries again."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import threading
from collections.abc import Callable

from composable_dra.k8s import retry
from composable_dra.process import logs
from composable_dra.serving.counters import LIMITED
from composable_dra.serving.limits import ACCEPT_FAILED, Budget, ServerLimits
from composable_dra.serving.throttle import Throttle

log = logs.get(__name__)

# ``accept`` failures: the first pause, and the longest.
ACCEPT_BACKOFF = (0.01, 1.0)

# serve(conn, peer, release): serve an accepted connection; ``release`` (idempotent) hands
# its place in the budget back once the connection is gone.
Serve = Callable[[socket.socket, str, Callable[[], None]], None]
# refuse(conn, reason): a best-effort answer to a refused connection, that never waits.
Refuse = Callable[[socket.socket, str], None]


def accept_backoff(failures: int) -> float:
    """The pause after the ``failures``-th ``accept`` failure in a row: the retry policy's
    (composable_dra/k8s/retry.py), from the first pause up to the longest."""
    first, longest = ACCEPT_BACKOFF
    return retry.delay(failures, cap=longest, first=first)


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking listening TCP socket."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def once(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn``, run on the first call only (a connection is released exactly once)."""
    lock = threading.Lock()
    done = [False]

    def run() -> None:
        with lock:
            if done[0]:
                return
            done[0] = True
        fn()

    return run


def _no_answer(_conn: socket.socket, _reason: str) -> None:
    pass


class Acceptor:
    """Accepts on ``listener`` for one server (``name``: its metrics label and logs)."""

    def __init__(
        self,
        name: str,
        limits: ServerLimits,
        budget: Budget,
        serve: Serve,
        refuse: Refuse = _no_answer,
        on_accept_error: Callable[[OSError], None] = lambda _exc: None,
    ) -> None:
        self.name, self.limits, self.budget = name, limits, budget
        self._serve, self._refuse, self._on_accept_error = serve, refuse, on_accept_error
        self._throttle = Throttle()

    async def run(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        failures = 0  # accept failures in a row
        while True:
            try:
                conn, addr = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM, ECONNABORTED...
                failures += 1
                pause = accept_backoff(failures)
                LIMITED.labels(self.name, ACCEPT_FAILED).inc()
                self._on_accept_error(exc)
                if (dropped := self._throttle.allow()) is not None:
                    log.warning(
                        "accept failed; backing off",
                        server=self.name,
                        error=errno.errorcode.get(exc.errno or 0, str(exc)),
                        retry_in_s=pause,
                        dropped=dropped,
                    )
                await asyncio.sleep(pause)
                continue
            failures = 0
            self._admit(conn, str(addr[0]) if isinstance(addr, tuple) else "local")

    def _admit(self, conn: socket.socket, peer: str) -> None:
        why = self.budget.take(self.name, peer, self.limits.per_peer)
        if why is not None:
            LIMITED.labels(self.name, why).inc()
            with contextlib.suppress(Exception):
                self._refuse(conn, why)
            conn.close()
            if self._throttle.allow() is not None:
                log.debug("connection refused", server=self.name, peer=peer, reason=why)
            return
        release = once(lambda: self.budget.give(self.name, peer))
        try:
            self._serve(conn, peer, release)
        except Exception:
            release()
            conn.close()
            if self._throttle.allow() is not None:
                log.exception("cannot serve an accepted connection", server=self.name)
