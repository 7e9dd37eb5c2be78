"""The suite's one retry policy, on tenacity (docs/architecture.md, Rules for the Kubernetes API).

Exponential backoff with "equal jitter": the n-th wait is d/2 + uniform(0, d/2), where
d = min(cap, first * 2**(n-1)). Half of each wait is random, so many clients that failed
together (every kubelet emulator when the API server restarts) do not retry together,
and no wait is near zero or above ``cap``. Each loop passes its cap: how long a failure
may go unnoticed after it is mended.

An error that names its own wait (a ``retry_after`` attribute, from a Retry-After
header) is retried after that wait instead, up to MAX_OWN_WAIT: a fabric that asks for
days is not obeyed for days (composable_dra/fabric/retry_after.py refuses such answers
at the edge; this is the second line for every other source of a ``retry_after``).

Loops that must end promptly on shutdown pass their stop event: waits end when it is set,
and no attempt starts after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import tenacity
from tenacity.wait import wait_base

from composable_dra.process import logs

T = TypeVar("T")
OnError = Callable[[BaseException, float], None]

log = logs.get(__name__)

# The longest wait an error may ask for: longer and the loop would look like a hang.
MAX_OWN_WAIT = 300.0


def _own_wait(after: object) -> float | None:
    """A Retry-After (seconds) worth obeying, at most MAX_OWN_WAIT: a number, not
    negative, not NaN; else None (the policy's own backoff)."""
    if not isinstance(after, int | float) or isinstance(after, bool):
        return None
    if math.isnan(after) or after < 0:
        return None
    return min(float(after), MAX_OWN_WAIT)


class _RetryAfter(wait_base):
    """The error's own ``retry_after`` (seconds) where it has one, else ``fallback``."""

    def __init__(self, fallback: wait_base) -> None:
        self.fallback = fallback

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        outcome = retry_state.outcome
        exc = outcome.exception() if outcome is not None else None
        after = _own_wait(getattr(exc, "retry_after", None))
        return self.fallback(retry_state) if after is None else after


def policy(*, cap: float, first: float = 0.2) -> wait_base:
    """The wait strategy: equal-jitter exponential backoff from ``first`` up to ``cap``."""
    if not (first > 0 and cap > 0):
        raise ValueError(f"need first > 0 and cap > 0, got first={first}, cap={cap}")
    first = min(first, cap)
    half = tenacity.wait_exponential(multiplier=first / 2, max=cap / 2)
    jitter = tenacity.wait_random_exponential(multiplier=first / 2, max=cap / 2)
    return _RetryAfter(half + jitter)


def delay(
    attempt: int, *, cap: float, first: float = 0.2, retry_after: float | None = None
) -> float:
    """The wait before retry ``attempt`` (1 for the first retry), for loops that count
    their own failures (a work queue's per-item retries, the operator's attach daemon).
    ``retry_after``: the wait the failed call asked for, which wins as in ``policy``."""
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    after = _own_wait(retry_after)
    if after is not None:
        return after
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = attempt
    return policy(cap=cap, first=first)(state)


class _Stopped(Exception):
    """The stop event was set before an attempt."""


def _log_error(exc: BaseException, retry_in: float) -> None:
    log.warning("failed; retrying", error=str(exc), retry_in=round(retry_in, 2))


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, Exception) and not isinstance(exc, _Stopped)


def _report(on_error: OnError | None) -> Callable[[tenacity.RetryCallState], None]:
    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        if exc is not None:
            (on_error or _log_error)(exc, wait)

    return before_sleep


class StopFlag(Protocol):
    """What ends a retry loop: a ``threading.Event``, an ``asyncio.Event``, kopf's ``stopped``."""

    def is_set(self) -> bool: ...


def _settings(stop: StopFlag, cap: float, first: float, on_error: OnError | None) -> dict[str, Any]:
    """What both variants pass tenacity: the policy, retry every Exception, end on stop."""
    return {
        "wait": policy(cap=cap, first=first),
        "retry": tenacity.retry_if_exception(_retryable),
        "stop": lambda _state: stop.is_set(),
        "before_sleep": _report(on_error),
    }


def forever(
    fn: Callable[[], T],
    stop: threading.Event,
    *,
    cap: float,
    first: float = 0.2,
    on_error: OnError | None = None,
) -> T | None:
    """``fn()``, retried after every Exception until it returns; None once ``stop`` is set.

    ``on_error(exc, retry_in)`` hears of each failure (default: a warning in the log).
    """

    def attempt() -> T:
        if stop.is_set():
            raise _Stopped
        return fn()

    def sleep(seconds: float) -> None:
        stop.wait(seconds)

    retrying = tenacity.Retrying(sleep=sleep, **_settings(stop, cap, first, on_error))
    try:
        return retrying(attempt)
    except (_Stopped, tenacity.RetryError):
        return None


async def _sleep_until(stop: StopFlag, seconds: float) -> None:
    if isinstance(stop, asyncio.Event):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        return
    wait = getattr(stop, "wait", None)
    if wait is not None:  # kopf's flag: wait(timeout)
        await wait(seconds)
    else:
        await asyncio.sleep(seconds)


async def forever_async(
    fn: Callable[[], Awaitable[T]],
    stop: StopFlag,
    *,
    cap: float,
    first: float = 0.2,
    on_error: OnError | None = None,
) -> T | None:
    """The async ``forever``: ``await fn()`` until it returns; None once ``stop`` is set."""

    async def attempt() -> T:
        if stop.is_set():
            raise _Stopped
        return await fn()

    async def sleep(seconds: float) -> None:
        await _sleep_until(stop, seconds)

    retrying = tenacity.AsyncRetrying(sleep=sleep, **_settings(stop, cap, first, on_error))
    try:
        return await retrying(attempt)
    except (_Stopped, tenacity.RetryError):
        return None


def bounded(
    fn: Callable[[], T],
    stop: threading.Event,
    *,
    retryable: Callable[[BaseException], bool],
    cap: float,
    first: float = 0.2,
    attempts: int | None = None,
    within: float | None = None,
) -> T:
    """``fn()``, tried while its error is ``retryable``, at most ``attempts`` times or, by
    time, until ``within`` seconds have passed since the first try (the last try starts
    within ``within + cap``), for a call whose caller must hear of a lasting failure (a
    lease opened at a donor, a client reconnecting to a donor that restarts).

    Raises the last error itself: one not ``retryable``, the last one tried, or the one
    before ``stop`` was set (no attempt starts after it).
    """
    if (attempts is None) == (within is None):
        raise ValueError("give attempts or within, not both")
    if attempts is not None and attempts < 1:
        raise ValueError(f"attempts counts from 1, got {attempts}")
    if within is not None and not within > 0:
        raise ValueError(f"need within > 0, got {within}")
    # Judged after each failed try: none follows one that ended ``within`` seconds after
    # the first began.
    rule = (
        tenacity.stop_after_attempt(attempts)
        if attempts is not None
        else tenacity.stop_after_delay(within or 0.0)
    )
    return _until(fn, stop, rule, retryable, cap, first)


def _until(
    fn: Callable[[], T],
    stop: threading.Event,
    rule: tenacity.stop.stop_base,
    retryable: Callable[[BaseException], bool],
    cap: float,
    first: float,
) -> T:
    failed: list[BaseException] = []

    def attempt() -> T:
        if failed and stop.is_set():
            raise failed[-1]
        try:
            return fn()
        except Exception as exc:
            failed.append(exc)
            raise

    def sleep(seconds: float) -> None:
        stop.wait(seconds)

    retrying = tenacity.Retrying(
        wait=policy(cap=cap, first=first),
        retry=tenacity.retry_if_exception(lambda exc: _retryable(exc) and retryable(exc)),
        stop=rule | tenacity.stop_when_event_set(stop),
        sleep=sleep,
        reraise=True,
    )
    return retrying(attempt)
