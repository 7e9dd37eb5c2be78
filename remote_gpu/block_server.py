"""The pipeline's side of the block pattern: an HTTP server its blocks pull frames from.

Blocks (pods of a Deployment, each with a remote GPU) come and go as the Deployment
scales; they reach the pipeline through its Service, so it needs no list of them. Each
block asks for a frame when it has room (``remote_gpu.block_wire``) and answers it; the
``Dispatcher`` keeps each block to ``bound`` frames unanswered and the results in frame
order. A block silent for ``silent_after`` seconds is taken as gone (scaled in, its node
lost): its frames go back to the head of the queue. The same server answers
``/metrics`` (``remote_gpu_pipeline_*``, what an HPA on the blocks reads).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np
from aiohttp import web
from prometheus_client.aiohttp import make_aiohttp_handler

from composable_dra.serving.http import HttpServer, serve_app
from composable_dra.serving.limits import ServerLimits
from remote_gpu import block_wire
from remote_gpu.dispatch import Dispatcher, NotHeld
from remote_gpu.metrics import PIPELINE_QUEUE

Arrays = tuple[np.ndarray, ...]
Answer = tuple[str, Arrays]  # the block that answered, its results
LIMITS = ServerLimits(per_peer=64, header_timeout=10.0, body_timeout=10.0, max_body=16 << 20)
TAKE_WAIT = 1.0  # how long a take waits for a frame before 204


def silent(last_seen: Mapping[str, float], now: float, after: float) -> list[str]:
    """The blocks not heard from for more than ``after`` seconds."""
    return sorted(b for b, t in last_seen.items() if now - t > after)


class BlockServer:
    def __init__(
        self,
        bound: int,
        silent_after: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.frames: Dispatcher[Arrays, Answer] = Dispatcher(bound)
        self.silent_after, self._clock = silent_after, clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        # Takes wait on a condition: on threads of their own, never on the event loop.
        self._waits = concurrent.futures.ThreadPoolExecutor(64, thread_name_prefix="take")

    def _heard(self, block: str) -> None:
        with self._lock:
            self._seen[block] = self._clock()

    def reap(self) -> list[str]:
        """Frames of blocks gone silent back to the queue; those blocks' names."""
        with self._lock:
            gone = silent(self._seen, self._clock(), self.silent_after)
            for b in gone:
                del self._seen[b]
        for b in gone:
            self.frames.lost(b)
        return gone

    async def take(self, request: web.Request) -> web.Response:
        block = block_wire.block_name(request.query)
        self._heard(block)
        loop = asyncio.get_running_loop()
        got = await loop.run_in_executor(self._waits, self.frames.take, block, TAKE_WAIT)
        PIPELINE_QUEUE.set(self.frames.depth)
        if got is None:
            return web.Response(status=204)
        seq, arrays = got
        headers = {block_wire.FRAME_HEADER: str(seq)}
        return web.Response(body=block_wire.encode(arrays), headers=headers)

    async def answer(self, request: web.Request) -> web.Response:
        block = block_wire.block_name(request.query)
        seq = block_wire.frame_number(request.query)
        results = block_wire.decode(await request.read())
        self._heard(block)
        try:
            self.frames.done(block, seq, (block, results))
        except NotHeld as exc:
            return web.json_response({"code": "not_held", "message": str(exc)}, status=409)
        return web.Response(status=204)

    @web.middleware
    async def _refusals(self, request: web.Request, handler: object) -> web.StreamResponse:
        try:
            return await handler(request)  # type: ignore[operator, no-any-return]
        except block_wire.BadBlockRequest as exc:
            return web.json_response({"code": "bad_request", "message": str(exc)}, status=400)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=LIMITS.max_body, middlewares=[self._refusals])
        app.router.add_post("/v1/take", self.take)
        app.router.add_post("/v1/answer", self.answer)
        app.router.add_get("/metrics", make_aiohttp_handler())
        return app

    def serve(self, host: str, port: int) -> HttpServer:
        """Serve on a thread and event loop of its own; returns once listening."""
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="block-server", daemon=True).start()
        started = asyncio.run_coroutine_threadsafe(
            serve_app(self.app(), host, port, name="block-server", limits=LIMITS), loop
        )
        return started.result(30)
