"""Logs a flood cannot multiply: a few lines a second per kind, then a count of the rest.

A peer that makes every connection fail once made the donor log thousands of tracebacks a
second; every server's error lines go through a :class:`Throttle`, and aiohttp's own
request-error lines through :class:`HttpErrorFilter`, which also drops the parser's
message (it quotes the rejected header line, credentials included).
"""

from __future__ import annotations

import logging
import threading

from aiohttp.http_exceptions import HttpProcessingError

from composable_dra.serving.token_bucket import TokenBucket

RATE = 5.0  # lines a second, after a burst
BURST = 20.0


class Throttle:
    """Whether one more line may be logged; counts the ones that may not."""

    def __init__(self, rate: float = RATE, burst: float = BURST) -> None:
        self._bucket = TokenBucket(rate, burst)
        self._lock = threading.Lock()
        self.suppressed = 0

    def allow(self, now: float | None = None) -> int | None:
        """None: drop this line. Else log it, with this many dropped since the last."""
        with self._lock:
            if not self._bucket.take(now):
                self.suppressed += 1
                return None
            dropped, self.suppressed = self.suppressed, 0
            return dropped


def summary(exc: BaseException) -> str:
    """What may be logged of a request the HTTP parser refused: its kind and status, never
    its text (which quotes the bytes it refused)."""
    status = getattr(exc, "code", 400)
    return f"{type(exc).__name__} (HTTP {status})"


class HttpErrorFilter(logging.Filter):
    """For aiohttp's server logger: a refused or broken-off request's line without the
    parser's text or a traceback, and at most ``RATE`` lines a second."""

    def __init__(self, throttle: Throttle | None = None) -> None:
        super().__init__()
        self._throttle = throttle or Throttle()

    def filter(self, record: logging.LogRecord) -> bool:
        dropped = self._throttle.allow()
        if dropped is None:
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            _peer_said(record, "refused a malformed request from %s: %s", summary(exc))
        elif isinstance(exc, ConnectionError):  # gone, or cut off by a deadline
            _peer_said(record, "connection from %s ended mid-request: %s", type(exc).__name__)
        if dropped:
            record.msg = f"{record.msg} (%d similar lines dropped)"
            record.args = (*(record.args if isinstance(record.args, tuple) else ()), dropped)
        return True


def _peer_said(record: logging.LogRecord, msg: str, what: str) -> None:
    """``record`` as a line about what its peer did: no traceback, a warning (the peer's
    doing, not the server's error)."""
    args = record.args if isinstance(record.args, tuple) else ()
    record.msg, record.args = msg, (args[0] if args else "?", what)
    record.exc_info, record.exc_text = None, None
    record.levelno, record.levelname = logging.WARNING, "WARNING"


def http_logger(server: str) -> logging.Logger:
    """The logger a server's aiohttp request handlers log to."""
    logger = logging.getLogger(f"composable_dra.serving.{server}")
    if not any(isinstance(f, HttpErrorFilter) for f in logger.filters):
        logger.addFilter(HttpErrorFilter())
    return logger
