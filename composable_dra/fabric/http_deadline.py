"""A requests adapter whose calls get their answer's headers by a deadline.

requests' ``timeout`` bounds each socket read: a fabric that sends its status line and
headers a byte at a time holds a call as long as it likes. Within ``deadline(at)``, a
connection of this adapter shuts its socket down at ``at`` while it waits for the
headers, which ends the wait (a ConnectionError to requests). The body is bounded by
http_answer.read_body. Only while the headers are awaited: then the connection is this
call's alone, never one back in the pool that another call may be using.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.response import HTTPResponse

_call = threading.local()  # .at: this thread's call's deadline (time.monotonic)


@contextlib.contextmanager
def deadline(at: float) -> Iterator[None]:
    """The calls of this thread in the block end (their headers come) by ``at``."""
    _call.at = at
    try:
        yield
    finally:
        _call.at = None


class _Guard:
    """Shuts a socket down when fired, unless disarmed first."""

    def __init__(self, sock: socket.socket | None) -> None:
        self._sock, self._lock, self._armed = sock, threading.Lock(), True

    def fire(self) -> None:
        with self._lock:
            if self._armed and self._sock is not None:
                with contextlib.suppress(OSError):  # already closed: nothing to end
                    self._sock.shutdown(socket.SHUT_RDWR)

    def disarm(self) -> None:
        with self._lock:
            self._armed = False


def _headers_by_deadline(
    getresponse: Callable[[], HTTPResponse], sock: socket.socket | None
) -> HTTPResponse:
    at = getattr(_call, "at", None)
    if at is None:
        return getresponse()
    guard = _Guard(sock)
    timer = threading.Timer(max(0.0, at - time.monotonic()), guard.fire)
    timer.daemon = True
    timer.start()
    try:
        return getresponse()
    finally:
        timer.cancel()
        guard.disarm()


class _HTTPConnection(HTTPConnection):
    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3's own
        return _headers_by_deadline(super().getresponse, self.sock)


class _HTTPSConnection(HTTPSConnection):
    def getresponse(self) -> HTTPResponse:  # type: ignore[override]  # as urllib3's own
        return _headers_by_deadline(super().getresponse, self.sock)


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


class DeadlineAdapter(HTTPAdapter):
    """An HTTPAdapter whose connections honour ``deadline`` (proxied calls too)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
        return manager
