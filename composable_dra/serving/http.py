"""aiohttp applications served behind :class:`ServerLimits`.

aiohttp's own sites bound neither connections nor the time a request's headers may take
(a peer that sends half a request holds its connection for ever). Here the accept loop is
ours (``accept``), and each connection's aiohttp protocol sits behind a :class:`_Guard`
that ends it when its headers or its body are late; a middleware tells the guard where a
request stands. The body's size is the application's ``client_max_size``, which each
server sets to its ``limits.max_body`` (aiohttp refuses a larger body as the handler
reads it, and the application answers that in its own form).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web

from composable_dra.process import logs
from composable_dra.serving.accept import Acceptor, listen
from composable_dra.serving.counters import LIMITED
from composable_dra.serving.limits import (
    BODY_TIMEOUT,
    HEADER_TIMEOUT,
    Budget,
    ServerLimits,
    process_budget,
)
from composable_dra.serving.throttle import http_logger

log = logs.get(__name__)


class _Guard(asyncio.Protocol):
    """aiohttp's protocol for one connection, ended when the next request's headers are
    not in by its deadline; gives the connection's place back when it ends."""

    def __init__(
        self,
        inner: asyncio.Protocol,
        deadline: float,
        server: _Server,
        release: Callable[[], None],
    ) -> None:
        self.inner, self._deadline, self._server, self._release = inner, deadline, server, release
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._reading = False  # the timer is the body's

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._server.guards[self.inner] = self
        self.inner.connection_made(transport)
        self._arm(self._deadline)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._server.guards.pop(self.inner, None)
        self._release()
        self.inner.connection_lost(exc)

    # The middleware's calls: a request's headers are in; its body is (or is due); its
    # response is sent (the next request's headers are due).
    def headers_in(self) -> None:
        self._disarm()

    def body_due(self, deadline: float) -> None:
        self._arm(deadline, BODY_TIMEOUT)
        self._reading = True

    def body_in(self) -> None:
        if self._reading:
            self._reading = False
            self._disarm()

    def response_sent(self) -> None:
        self._reading = False
        loop = asyncio.get_running_loop()
        self._arm(loop.time() + self._server.limits.header_timeout)

    def _arm(self, deadline: float, reason: str = HEADER_TIMEOUT) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_at(deadline, self._expire, reason)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, reason: str) -> None:
        LIMITED.labels(self._server.name, reason).inc()
        if isinstance(self._transport, asyncio.Transport):
            self._transport.abort()  # no flushing to a peer this slow


class _Server:
    """One application's connections: their guards, and the middlewares that drive them."""

    def __init__(self, name: str, limits: ServerLimits) -> None:
        self.name, self.limits = name, limits
        self.guards: dict[object, _Guard] = {}
        self.handshakes: set[asyncio.Task[Any]] = set()  # accepted, not yet connected

    @web.middleware
    async def outermost(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """First of all: the headers are in, and the body is due within ``body_timeout``
        (whatever the application's middlewares then take); after all: the next
        request's headers are due. The body is left to the handler to read: a body of
        the usual size is buffered as it arrives, and ends its deadline by itself."""
        guard = self.guards.get(request.protocol)
        if guard is not None:
            guard.headers_in()
            if request.body_exists and not request.content.at_eof():
                guard.body_due(asyncio.get_running_loop().time() + self.limits.body_timeout)
                request.content.on_eof(guard.body_in)
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            if guard is not None:
                guard.response_sent()


class HttpServer:
    """A started server: its bound address and its loop; ``cleanup()`` (on that loop)
    stops it."""

    def __init__(
        self,
        runner: web.AppRunner,
        listener: socket.socket,
        task: asyncio.Task[None],
        server: _Server,
    ) -> None:
        self.runner, self._listener, self._task, self._server = runner, listener, task, server
        self.host, self.port = listener.getsockname()[:2]
        self.loop = task.get_loop()

    async def cleanup(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._listener.close()
        for handshake in list(self._server.handshakes):
            handshake.cancel()
        await self.runner.cleanup()


async def serve_app(
    app: web.Application,
    host: str,
    port: int,
    *,
    name: str,
    limits: ServerLimits,
    ssl_context: ssl.SSLContext | None = None,
    budget: Budget | None = None,
) -> HttpServer:
    """Serve ``app`` (built with ``client_max_size=limits.max_body``) on ``host:port``
    (0: any free port) behind ``limits``."""
    server = _Server(name, limits)
    app.middlewares.insert(0, server.outermost)
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        keepalive_timeout=limits.header_timeout,
        logger=http_logger(name),
    )
    await runner.setup()
    factory = runner.server
    assert factory is not None  # set up above
    loop = asyncio.get_running_loop()

    def serve(conn: socket.socket, _peer: str, release: Callable[[], None]) -> None:
        deadline = loop.time() + limits.header_timeout

        def protocol() -> _Guard:
            return _Guard(factory(), deadline, server, release)

        task = loop.create_task(
            loop.connect_accepted_socket(
                protocol,
                conn,
                ssl=ssl_context,
                ssl_handshake_timeout=limits.header_timeout if ssl_context else None,
            )
        )
        server.handshakes.add(task)
        task.add_done_callback(server.handshakes.discard)
        task.add_done_callback(lambda t: _handshake_done(t, conn, release, name))

    listener = listen(host, port)
    acceptor = Acceptor(name, limits, budget or process_budget(), serve)
    task = loop.create_task(acceptor.run(listener))
    return HttpServer(runner, listener, task, server)


def _handshake_done(
    task: asyncio.Task[Any], conn: socket.socket, release: Callable[[], None], name: str
) -> None:
    """A connection whose TLS handshake failed or was late never reaches its guard: its
    place is given back here."""
    if task.cancelled() or task.exception() is not None:
        # asyncio ends a late TLS handshake with ConnectionAbortedError.
        late = (TimeoutError, ConnectionAbortedError)
        if not task.cancelled() and isinstance(task.exception(), late):
            LIMITED.labels(name, HEADER_TIMEOUT).inc()
        conn.close()
        release()
