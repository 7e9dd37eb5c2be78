"""The Prometheus endpoint every component serves, behind the servers' limits
(``composable_dra.serving``) on a thread and event loop of its own."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from composable_dra.serving.http import HttpServer, serve_app
from composable_dra.serving.limits import ServerLimits

# A scrape is a GET: no body is read.
LIMITS = ServerLimits(per_peer=8, header_timeout=10.0, body_timeout=5.0, max_body=1024)


def app() -> web.Application:
    handler = make_aiohttp_handler()
    application = web.Application(client_max_size=LIMITS.max_body)
    application.router.add_get("/metrics", handler)
    application.router.add_get("/", handler)
    return application


def serve(port: int, addr: str = "0.0.0.0") -> HttpServer | None:
    """Serve /metrics from the default registry; port 0 turns the endpoint off."""
    if not port:
        return None
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="metrics", daemon=True).start()
    started = asyncio.run_coroutine_threadsafe(
        serve_app(app(), addr, port, name="metrics", limits=LIMITS), loop
    )
    return started.result(30)
