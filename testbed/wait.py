"""Waiting on conditions with a deadline: the only way the tests synchronise."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    pass


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.1,
    describe: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that.

    Exceptions from ``condition`` count as "not yet" until the deadline, when the last
    one is chained to the timeout. ``describe`` adds the observed state to the failure.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except Exception as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f"; observed: {describe()}" if describe else ""
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}{detail}") from (
                last_error
            )
        time.sleep(interval)


def holds_for(
    condition: Callable[[], object],
    seconds: float,
    what: str,
    interval: float = 0.5,
    describe: Callable[[], str] | None = None,
) -> None:
    """Poll ``condition`` for ``seconds``; fail at the first poll where it is false (an
    invariant over a span of time, such as "stays Healthy for a minute")."""
    deadline = time.monotonic() + seconds
    while True:
        if not condition():
            detail = f"; observed: {describe()}" if describe else ""
            raise WaitTimeout(f"{what} stopped holding{detail}")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)
