"""A fabric's Retry-After, bounded: what every HTTP fabric backend obeys of it.

RFC 9110 allows delta-seconds or an HTTP date. A fabric that asks for a wait gets it up
to ``retry.MAX_OWN_WAIT``; one that asks for more than ABSURD seconds (a day) is not busy
but broken, and its answer is a ``BadAnswerError``: obeyed, ``999999999`` had the operator
wait for decades, and a long run of digits read as infinity.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import time
from collections.abc import Callable, Mapping

from composable_dra.fabric.errors import BadAnswerError
from composable_dra.k8s.retry import MAX_OWN_WAIT

ABSURD = 86_400.0  # seconds; no fabric manager is busy for longer than a day
_DIGITS = 9  # more digits than ABSURD has: refused before they become a float
BUSY = (429, 503)  # the answers whose Retry-After asks the caller to wait


def retry_after_seconds(
    value: str | None,
    default: float = 1.0,
    *,
    what: str = "Retry-After",
    now: Callable[[], float] = time.time,
) -> float:
    """The wait a Retry-After asks for, at most MAX_OWN_WAIT; ``default`` without one or
    for one that is neither form (RFC 9110: ignored); BadAnswerError beyond ABSURD."""
    if not value:
        return default
    text = value.strip()
    if text.isascii() and text.isdigit():
        wait = float(text) if len(text.lstrip("0")) <= _DIGITS else math.inf
    else:
        when = _date(text)
        if when is None:
            return default
        wait = max(0.0, when.timestamp() - now())
    if not wait <= ABSURD:
        raise BadAnswerError(f"{what}: Retry-After {text[:40]!r} asks for more than a day")
    return min(wait, MAX_OWN_WAIT)


def _date(text: str) -> datetime.datetime | None:
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    # "-0000" (no zone said) reads as naive: HTTP dates are GMT.
    return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)


def busy_wait(status: int, headers: Mapping[str, str], what: str) -> float | None:
    """The wait a 429 or 503 answer asks for (None for any other status)."""
    if status not in BUSY:
        return None
    return retry_after_seconds(headers.get("retry-after"), what=what)


def poll_hint(value: str | None, default: float = 1.0) -> float:
    """How soon to look at an accepted task again. The task runs whatever the hint says,
    so an absurd hint is not a failure of the change the fabric accepted: it is ignored
    (``default``), and the task is still followed."""
    try:
        return retry_after_seconds(value, default)
    except BadAnswerError:
        return default
