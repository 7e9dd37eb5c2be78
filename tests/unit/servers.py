"""Helpers of the servers' tests: an event loop on a thread, and whether a peer was cut off."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any


class Loop:
    """An event loop on a thread of its own, for servers under test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def cut_off(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (after whatever it
    says first)."""
    deadline = time.monotonic() + within
    sock.settimeout(within)
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False
    return False
