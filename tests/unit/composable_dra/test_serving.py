"""The servers' shared limits (composable_dra.serving): the bounds' arithmetic, the log
throttle and filter, and an aiohttp application behind them (a body that is late, an
accept that fails). Each server's own entry point: test_server_limits.py."""

from __future__ import annotations

import errno
import logging
import socket
import time
from typing import Any

import pytest
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from prometheus_client import REGISTRY

from composable_dra.serving.http import HttpServer, serve_app
from composable_dra.serving.limits import (
    PER_PEER,
    TOTAL,
    Budget,
    Held,
    ServerLimits,
    descriptor_share,
    refusal,
)
from composable_dra.serving.throttle import HttpErrorFilter, Throttle
from tests.unit.servers import Loop, cut_off

pytestmark = pytest.mark.usefixtures("fresh_budget")
SMALL = ServerLimits(per_peer=2, header_timeout=0.5, body_timeout=0.5, max_body=1024)


# ---- pure parts


def test_refusal_bounds_the_total_a_peer_at_a_server_and_a_peer_in_all() -> None:
    assert refusal(Held(0, 0, 0), per_peer=64, total=10) is None
    assert refusal(Held(4, 4, 9), per_peer=64, total=10) is None
    assert refusal(Held(0, 0, 10), per_peer=64, total=10) == TOTAL
    assert refusal(Held(2, 2, 2), per_peer=2, total=10) == PER_PEER  # its server's share
    assert refusal(Held(1, 5, 5), per_peer=64, total=10) == PER_PEER  # half the budget
    assert refusal(Held(0, 0, 0), per_peer=1, total=1) is None  # a tiny budget serves one


def test_descriptor_share_leaves_half_the_descriptors() -> None:
    assert descriptor_share(128) == 64 and descriptor_share(1) == 8


def test_budget_takes_and_gives_per_server_and_peer() -> None:
    budget = Budget(total=6)
    assert [budget.take("api", "a", 2) for _ in range(3)] == [None, None, PER_PEER]
    assert budget.take("data", "a", 2) is None  # another server's share
    assert budget.take("data", "a", 2) == PER_PEER  # half the budget: 3 of 6
    assert [budget.take("api", p, 8) for p in "bcd"] == [None, None, None]
    assert budget.take("api", "e", 8) == TOTAL and budget.held == 6
    budget.give("api", "a")
    assert budget.take("api", "e", 8) is None
    for server, peer in [("api", "a"), ("data", "a"), ("api", "b"), ("x", "nobody")]:
        budget.give(server, peer)
    assert budget.held == 3 and budget.take("api", "a", 2) is None


def test_throttle_lets_a_burst_through_then_counts_what_it_drops() -> None:
    throttle = Throttle(rate=1.0, burst=2.0)
    now = time.monotonic()
    assert [throttle.allow(now) for _ in range(5)] == [0, 0, None, None, None]
    assert throttle.allow(now + 1.0) == 3


def test_a_parser_refusal_is_logged_without_its_text() -> None:
    exc = BadHttpMessage("Invalid header value char: b'Authorization: Bearer s3cret\\x01'")
    record = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "Error handling request from %s", ("1.2.3.4",), None
    )
    record.exc_info = (type(exc), exc, None)
    assert HttpErrorFilter().filter(record)
    assert record.exc_info is None and "s3cret" not in record.getMessage()
    assert record.getMessage() == (
        "refused a malformed request from 1.2.3.4: BadHttpMessage (HTTP 400)"
    )


def test_a_broken_off_request_is_a_warning_without_a_traceback() -> None:
    """A body cut off at its deadline ends the handler with ConnectionResetError, which
    aiohttp logged as an error with its traceback, one per slow peer."""
    exc = ConnectionResetError("Connection lost")
    record = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "Error handling request from %s", ("1.2.3.4",), None
    )
    record.exc_info = (type(exc), exc, None)
    assert HttpErrorFilter().filter(record)
    assert record.exc_info is None and record.levelname == "WARNING"
    assert record.getMessage() == (
        "connection from 1.2.3.4 ended mid-request: ConnectionResetError"
    )


def _echo_server(loop: Loop) -> HttpServer:
    """An application that answers a POST with its body, behind ``SMALL``."""

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    app = web.Application(client_max_size=SMALL.max_body)
    app.router.add_post("/", echo)
    server: HttpServer = loop.run(serve_app(app, "127.0.0.1", 0, name="test", limits=SMALL))
    return server


def _post(port: int, body: bytes, length: int | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    size = len(body) if length is None else length
    sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (size, body))
    return sock


def test_a_slow_body_is_cut_off_at_the_body_deadline(loop: Loop) -> None:
    server = _echo_server(loop)
    try:
        with _post(server.port, b"abc", length=10) as sock:
            assert cut_off(sock, SMALL.body_timeout + 5)
        with _post(server.port, b"abc") as sock:
            assert sock.recv(4096).endswith(b"abc")
    finally:
        loop.run(server.cleanup())


def _limited(server: str, reason: str) -> float:
    labels = {"server": server, "reason": reason}
    return REGISTRY.get_sample_value("composable_dra_server_limited_total", labels) or 0.0


def test_accept_failures_are_survived(loop: Loop) -> None:
    """EMFILE from accept() must not end the accept loop (the data plane's first-round fix,
    now every server's)."""
    server = _echo_server(loop)
    real = loop.loop.sock_accept
    failures = [8]  # about 1.3 s of backing off

    async def failing(sock: socket.socket) -> tuple[socket.socket, Any]:
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        accepted: tuple[socket.socket, Any] = await real(sock)
        return accepted

    before = _limited("test", "accept_failed")
    setattr(loop.loop, "sock_accept", failing)  # noqa: B010 - mypy: a method
    try:
        # The accept already waiting takes the first; the ones after it fail.
        for body in (b"a", b"b"):
            with _post(server.port, body) as sock:
                assert sock.recv(4096).endswith(body)
        assert failures == [0] and _limited("test", "accept_failed") - before == 8
    finally:
        setattr(loop.loop, "sock_accept", real)  # noqa: B010
        loop.run(server.cleanup())
