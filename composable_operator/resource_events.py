"""Wakes a resource's attach daemon when kopf has that resource's next event.

kopf keeps each daemon's body current: it puts every watch event's object in the live
body before it calls the resource's handlers. A daemon that waits for something another
party writes (kopf's finalizer, the node plugin's DeviceVisible) waits for the next event
of its resource instead of looking every few milliseconds: at a thousand resources
waiting, looks at 20 a second each were 20,000 wake-ups a second for nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from composable_operator.live import Stopped

T = TypeVar("T")

# The longest a wait goes without a look, should an event not come (a watch that
# reconnects and relists brings none for an unchanged object).
FALLBACK_LOOK_SECONDS = 0.5


@dataclass
class ResourceEvents:
    """Per resource uid, the event a waiting daemon sleeps on (on kopf's event loop)."""

    _waiting: dict[str, asyncio.Event] = field(default_factory=dict)

    def arrived(self, uid: str) -> None:
        """kopf has a new event of this resource in its live body."""
        event = self._waiting.get(uid)
        if event is not None:
            event.set()

    async def wait_until(
        self,
        uid: str,
        body: T,
        stopped: Stopped,
        check: Callable[[T], bool],
        limit: float,
    ) -> bool:
        """Until ``check(body)`` holds (True), ``limit`` seconds pass or the daemon is
        stopped (False); it looks again on each event of the resource."""
        deadline = time.monotonic() + limit
        event = self._waiting.setdefault(uid, asyncio.Event())
        try:
            while not stopped:
                event.clear()  # before the look: an event after it wakes the wait below
                if check(body):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                await _first(event.wait(), stopped.wait(min(left, FALLBACK_LOOK_SECONDS)))
            return False
        finally:
            if self._waiting.get(uid) is event:
                del self._waiting[uid]


async def _first(*waits: Awaitable[Any]) -> None:
    """Until the first of ``waits`` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
