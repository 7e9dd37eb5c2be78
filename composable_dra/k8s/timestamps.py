"""RFC 3339 times as the Kubernetes API writes them: UTC, whole seconds, a ``Z``."""

from __future__ import annotations

import datetime
import time


def format_time(ts: float) -> str:
    """A Unix time as ``2006-01-02T15:04:05Z`` (fractions of a second dropped)."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    return format_time(time.time())


def parse_time(value: str | None) -> float | None:
    """The Unix time of an RFC 3339 string (``Z`` or an offset); None if absent or malformed."""
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:  # not RFC 3339, but read as UTC rather than local time
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()
