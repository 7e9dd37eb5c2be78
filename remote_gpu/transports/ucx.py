"""UCX through ``ucxx`` (the optional ``ucx`` extra): RDMA verbs where the host's UCX has
them, otherwise whatever UCX picks (tested here over its tcp transport).

UCX messages keep their boundaries, so each header and each inline payload travels as its
own message and the receiver posts a receive of exactly the size it expects: a header,
then the payload length the header announced. Payloads are received straight into the
lease's arena, as with TCP. The client side is blocking: it drives ``ucxx``'s asyncio API
on a private event loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from remote_gpu.errors import DeadlineExceeded
from remote_gpu.transports import ClientTransport, Frame, ServerTransport, pieces

if TYPE_CHECKING:
    from remote_gpu.donor import Donor

T = TypeVar("T")


def available() -> bool:
    return importlib.util.find_spec("ucxx") is not None


def _ucxx() -> Any:
    try:
        import ucxx
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise RuntimeError("the UCX transport needs the 'ucx' extra (ucxx)") from exc
    return ucxx


class UcxServerTransport(ServerTransport):
    name = "ucx"

    def __init__(self, endpoint: Any) -> None:
        self.ep = endpoint
        self.peer = "ucx"

    async def send_frames(self, frames: Sequence[Frame]) -> None:
        for piece in pieces(frames):
            await self.ep.send(piece)

    async def recv_into(self, view: memoryview) -> None:
        if len(view):
            await self.ep.recv(view)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._closing = asyncio.get_running_loop().create_task(self.ep.close())


async def listen(donor: Donor, port: int) -> Any:
    """Accept UCX connections for ``donor`` on ``port``; returns the listener."""
    ucxx = _ucxx()

    async def handler(endpoint: Any) -> None:
        await donor.serve(UcxServerTransport(endpoint))

    return ucxx.create_listener(handler, port)


class UcxClientTransport(ClientTransport):
    name = "ucx"

    def __init__(self, host: str, port: int, timeout: float | None = 30.0) -> None:
        self._ucxx = _ucxx()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._timeout = timeout
        self.ep = self._call(self._ucxx.create_endpoint(host, port))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop; :class:`DeadlineExceeded` after ``timeout``
        (the operation is cancelled: the endpoint is then of no further use)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(self._timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise DeadlineExceeded("the donor did not answer over UCX in time") from None

    def send_frames(self, frames: Sequence[Frame], drain: Callable[[], bool] | None = None) -> None:
        async def send() -> None:
            for piece in pieces(frames):
                await self.ep.send(piece)

        self._call(send())

    def recv_into(self, view: memoryview) -> None:
        if len(view):
            self._call(self.ep.recv(view))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a dead endpoint
            self._call(self.ep.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
