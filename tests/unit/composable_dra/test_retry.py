"""composable_dra.k8s.retry: the one retry policy (bounds, Retry-After, stop)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

import pytest
import tenacity
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.k8s import retry


@settings(max_examples=200)
@given(
    attempt=st.integers(min_value=1, max_value=200),
    first=st.floats(min_value=0.01, max_value=2.0),
    extra=st.floats(min_value=0.0, max_value=60.0),
)
def test_each_wait_lies_between_half_and_all_of_the_capped_exponential(
    attempt: int, first: float, extra: float
) -> None:
    cap = first + extra
    ceiling = min(cap, first * 2 ** min(attempt - 1, 64))
    wait = retry.delay(attempt, cap=cap, first=first)
    assert ceiling / 2 - 1e-9 <= wait <= ceiling + 1e-9


def test_waits_grow_to_the_cap_and_are_jittered() -> None:
    waits = [retry.delay(n, cap=5.0) for n in range(1, 30)]
    assert max(waits[:2]) <= 0.4  # the first retries come quickly
    assert all(2.5 <= w <= 5.0 for w in waits[10:])  # later ones stay near the cap
    assert len({round(w, 6) for w in waits[10:]}) > 1  # not in lockstep


def test_a_first_wait_above_the_cap_is_the_cap() -> None:
    assert 0.05 <= retry.delay(1, cap=0.1, first=1.0) <= 0.1


@pytest.mark.parametrize(("after", "expected"), [(7.0, 7.0), (0, 0.0), (250.0, 250.0)])
def test_a_wait_the_server_asked_for_wins(after: float, expected: float) -> None:
    assert retry.delay(3, cap=5.0, retry_after=after) == expected


def test_a_negative_wait_the_server_asked_for_is_ignored() -> None:
    assert 0.4 <= retry.delay(3, cap=5.0, retry_after=-1.0) <= 0.8


@pytest.mark.parametrize("after", [999_999_999.0, float("inf"), 1e308])
def test_an_absurd_wait_the_server_asked_for_is_capped(after: float) -> None:
    """Issue 25.5: a fabric's Retry-After of decades (or infinity) was obeyed as asked."""
    assert retry.delay(3, cap=5.0, retry_after=after) == retry.MAX_OWN_WAIT


def test_a_nan_wait_the_server_asked_for_is_ignored() -> None:
    assert 0.4 <= retry.delay(3, cap=5.0, retry_after=float("nan")) <= 0.8


def test_forever_waits_no_longer_than_the_cap_on_an_absurd_retry_after() -> None:
    class Busy(Exception):
        retry_after = float("inf")

    waits: list[float] = []
    calls: list[int] = []

    def busy_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise Busy
        return "done"

    retrying = tenacity.Retrying(sleep=waits.append, wait=retry.policy(cap=1.0))
    assert retrying(busy_once) == "done"
    assert waits == [retry.MAX_OWN_WAIT]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        retry.policy(cap=0.0, first=1.0)
    with pytest.raises(ValueError):
        retry.policy(cap=1.0, first=-1)
    with pytest.raises(ValueError):
        retry.delay(0, cap=1.0)


def test_forever_retries_until_success_and_reports_each_failure() -> None:
    calls: list[int] = []
    heard: list[tuple[str, float]] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError(f"try {len(calls)}")
        return "done"

    got = retry.forever(
        flaky,
        threading.Event(),
        cap=0.05,
        first=0.01,
        on_error=lambda e, w: heard.append((str(e), w)),
    )
    assert got == "done" and len(calls) == 3
    assert [h[0] for h in heard] == ["try 1", "try 2"]
    assert all(0 < w <= 0.05 for _, w in heard)


def test_an_errors_own_retry_after_is_its_wait() -> None:
    class Busy(Exception):
        retry_after = 0.03

    heard: list[float] = []
    calls: list[int] = []

    def busy_once() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise Busy()

    retry.forever(
        busy_once, threading.Event(), cap=60, first=30, on_error=lambda _e, w: heard.append(w)
    )
    assert heard == [0.03]


def test_forever_ends_promptly_when_stopped_during_a_wait() -> None:
    stop = threading.Event()
    calls: list[int] = []

    def failing() -> None:
        calls.append(1)
        raise RuntimeError("down")

    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    assert retry.forever(failing, stop, cap=60, first=30, on_error=lambda *_: None) is None
    assert time.monotonic() - start < 5  # not the 15-30 s wait
    assert len(calls) == 1  # no attempt after the stop


def test_forever_does_not_start_once_stopped() -> None:
    stop = threading.Event()
    stop.set()
    called: list[int] = []
    assert retry.forever(lambda: called.append(1), stop, cap=1) is None
    assert called == []


def test_forever_async_retries_and_stops() -> None:
    async def scenario() -> tuple[str | None, int | None]:
        calls: list[int] = []

        async def flaky() -> str:
            calls.append(1)
            if len(calls) < 2:
                raise RuntimeError("once")
            return "ok"

        stop = asyncio.Event()
        first = await retry.forever_async(
            flaky, stop, cap=0.05, first=0.01, on_error=lambda *_: None
        )

        async def failing() -> int:
            raise RuntimeError("down")

        asyncio.get_running_loop().call_later(0.1, stop.set)
        second = await asyncio.wait_for(
            retry.forever_async(failing, stop, cap=60, first=30, on_error=lambda *_: None), 5
        )
        return first, second

    assert asyncio.run(scenario()) == ("ok", None)


class _Flaky(Exception):
    def __init__(self, lasting: bool = False) -> None:
        super().__init__("lasting" if lasting else "passing")
        self.lasting = lasting


def _not_lasting(exc: BaseException) -> bool:
    return isinstance(exc, _Flaky) and not exc.lasting


def test_bounded_retries_a_retryable_error_until_success() -> None:
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise _Flaky
        return 7

    got = retry.bounded(
        flaky, threading.Event(), attempts=3, retryable=_not_lasting, cap=0.01, first=0.001
    )
    assert got == 7 and len(calls) == 3


def test_bounded_raises_the_last_error_itself() -> None:
    calls: list[_Flaky] = []

    def failing(lasting: bool) -> int:
        calls.append(_Flaky(lasting))
        raise calls[-1]

    for lasting, tries in ((True, 1), (False, 3)):
        calls.clear()
        with pytest.raises(_Flaky) as caught:
            retry.bounded(
                functools.partial(failing, lasting),
                threading.Event(),
                attempts=3,
                retryable=_not_lasting,
                cap=0.01,
                first=0.001,
            )
        assert caught.value is calls[-1] and len(calls) == tries


def test_bounded_starts_no_attempt_once_stopped() -> None:
    stop = threading.Event()
    calls: list[int] = []

    def failing() -> int:
        calls.append(1)
        stop.set()  # set while this attempt runs: the wait after it ends at once
        raise _Flaky

    started = time.monotonic()
    with pytest.raises(_Flaky):
        retry.bounded(failing, stop, attempts=5, retryable=_not_lasting, cap=60.0, first=30.0)
    assert len(calls) == 1 and time.monotonic() - started < 5


def test_bounded_needs_an_attempt() -> None:
    with pytest.raises(ValueError):
        retry.bounded(lambda: 1, threading.Event(), attempts=0, retryable=_not_lasting, cap=1.0)


def test_bounded_by_time_retries_until_success_and_gives_up_after_its_time() -> None:
    calls: list[float] = []

    def flaky() -> int:
        calls.append(time.monotonic())
        if len(calls) < 4:
            raise _Flaky
        return 7

    stop = threading.Event()
    got = retry.bounded(flaky, stop, within=5.0, retryable=_not_lasting, cap=0.01)
    assert got == 7
    assert len(calls) == 4
    calls.clear()

    def failing() -> int:
        calls.append(time.monotonic())
        raise _Flaky

    started = time.monotonic()
    with pytest.raises(_Flaky):
        retry.bounded(failing, threading.Event(), within=0.3, retryable=_not_lasting, cap=0.05)
    # Tried again and again, never after the time was up (and one wait of the cap).
    assert len(calls) > 2 and calls[-1] - started <= 0.3 + 0.05 + 0.05
    calls.clear()
    with pytest.raises(_Flaky):  # a lasting error: once
        retry.bounded(
            functools.partial(failing_with, True), threading.Event(), within=5.0,
            retryable=_not_lasting, cap=0.01,
        )  # fmt: skip
    with pytest.raises(ValueError):
        retry.bounded(lambda: 1, threading.Event(), within=0, retryable=_not_lasting, cap=1.0)
    with pytest.raises(ValueError):  # one bound, not two
        retry.bounded(
            lambda: 1, threading.Event(), attempts=2, within=1.0, retryable=_not_lasting, cap=1.0
        )


def failing_with(lasting: bool) -> int:
    raise _Flaky(lasting)
