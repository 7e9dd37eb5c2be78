"""A fabric's Retry-After, bounded (issue 25.5): capped, and a wait of days is a typed
fabric error, never decades of waiting or an untyped exception."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.fabric import errors as fe
from composable_dra.fabric import fsas_answers, redfish
from composable_dra.fabric.retry_after import (
    ABSURD,
    busy_wait,
    poll_hint,
    retry_after_seconds,
)
from composable_dra.k8s.retry import MAX_OWN_WAIT

NOW = 1_800_000_000.0  # 2027-01-15


def at_now() -> float:
    return NOW


@pytest.mark.parametrize(
    ("value", "wait"),
    [
        ("7", 7.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("86400", MAX_OWN_WAIT),  # a day: asked, but waited for at most the cap
        ("600", MAX_OWN_WAIT),
        ("Fri, 15 Jan 2027 08:00:30 GMT", 30.0),
        ("Fri, 15 Jan 2027 08:00:30 -0000", 30.0),  # no zone said: GMT, not local time
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # in the past: at once
        (None, 1.0),
        ("", 1.0),
        ("soon", 1.0),  # neither form: ignored (RFC 9110)
        ("-5", 1.0),
        ("1.5", 1.0),
        ("²", 1.0),  # a digit to str.isdigit, not to float()
    ],
)
def test_waits_are_read_and_capped(value: str | None, wait: float) -> None:
    assert retry_after_seconds(value, now=at_now) == wait


@pytest.mark.parametrize(
    "value",
    ["999999999", "9" * 400, "86401", "Fri, 01 Jan 9999 00:00:00 GMT"],
)
def test_a_wait_of_more_than_a_day_is_a_bad_answer(value: str) -> None:
    with pytest.raises(fe.BadAnswerError, match="more than a day"):
        retry_after_seconds(value, now=at_now)


def test_leading_zeros_do_not_make_a_short_wait_absurd() -> None:
    assert retry_after_seconds("0000000000005", now=at_now) == 5.0


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize(
    "error_for", [redfish.error_for, fsas_answers.error_for], ids=["redfish", "fsas"]
)
def test_every_backend_refuses_an_absurd_busy_answer(status: int, error_for: object) -> None:
    """Obeyed, ``Retry-After: 999999999`` had the operator wait 31 years."""
    build = error_for  # a Redfish or an Fsas answer: the same rule
    with pytest.raises(fe.BadAnswerError) as caught:
        build(status, {}, {"retry-after": "999999999"}, "attach gpu-1")  # type: ignore[operator]
    assert "attach gpu-1" in str(caught.value)
    busy = build(status, {}, {"retry-after": "3"}, "op")  # type: ignore[operator]
    assert isinstance(busy, fe.BusyError) and busy.retry_after == 3.0


def test_only_busy_answers_ask_for_a_wait() -> None:
    assert busy_wait(500, {"retry-after": "999999999"}, "op") is None
    assert busy_wait(503, {}, "op") == 1.0


def test_a_task_monitors_absurd_hint_is_ignored_not_a_failure() -> None:
    """A 202's Retry-After only says when to look again at a change the fabric accepted:
    failing the call there would lose the task to follow."""
    assert poll_hint("999999999") == 1.0
    assert poll_hint("2") == 2.0
    assert poll_hint("600") == MAX_OWN_WAIT


@settings(max_examples=500)
@given(st.text(max_size=60) | st.integers(min_value=0).map(str) | st.none())
def test_any_header_is_a_bounded_wait_or_a_bad_answer(value: str | None) -> None:
    try:
        wait = retry_after_seconds(value, now=at_now)
    except fe.BadAnswerError:
        return
    assert 0.0 <= wait <= MAX_OWN_WAIT <= ABSURD
