"""A waiting attach daemon is woken by its resource's events (resource_events.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from composable_operator.resource_events import FALLBACK_LOOK_SECONDS, ResourceEvents


class Stopped:
    """Never stops on its own; sleeps for real and counts the looks it was asked for."""

    def __init__(self) -> None:
        self.waits = 0
        self.stop = False

    def __bool__(self) -> bool:
        return self.stop

    def wait(self, timeout: float | None = None) -> Awaitable[None]:
        self.waits += 1
        return asyncio.sleep(timeout or 0)


def test_an_event_of_the_resource_wakes_the_wait_at_once_and_nothing_else_does():
    async def scenario() -> tuple[bool, float, int, int]:
        events = ResourceEvents()
        body = {"visible": False}
        stopped = Stopped()
        waiting = asyncio.ensure_future(
            events.wait_until("uid-1", body, stopped, lambda b: b["visible"], 10)
        )
        await asyncio.sleep(1.2)
        looks_idle = stopped.waits  # no event: a look each FALLBACK_LOOK_SECONDS only
        events.arrived("uid-2")  # another resource's event
        body["visible"] = True
        t0 = time.monotonic()
        events.arrived("uid-1")
        done = await asyncio.wait_for(waiting, 5)
        return done, time.monotonic() - t0, looks_idle, len(events._waiting)

    done, took, looks_idle, left = asyncio.run(scenario())
    assert done and took < FALLBACK_LOOK_SECONDS / 2
    # A look every 50 ms (the old poll) would be 24 in 1.2 s.
    assert looks_idle <= 1.2 / FALLBACK_LOOK_SECONDS + 1
    assert left == 0  # nothing kept once the wait ended


def test_the_wait_ends_at_its_limit_or_when_the_daemon_stops():
    async def scenario() -> tuple[bool, bool, float]:
        events = ResourceEvents()
        t0 = time.monotonic()
        timed_out = await events.wait_until("u", {}, Stopped(), lambda b: False, 0.2)
        took = time.monotonic() - t0
        stopped = Stopped()
        stopped.stop = True
        when_stopped = await events.wait_until("u", {}, stopped, lambda b: False, 10)
        return timed_out, when_stopped, took

    timed_out, when_stopped, took = asyncio.run(scenario())
    assert not timed_out and not when_stopped
    assert 0.2 <= took < 1.0
