"""One logging setup for every component: structlog, JSON by default, readable on a TTY.

Bound keys: component, node, claim, resource, fabric, device, phase (docs/operations.md).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

Format = Literal["auto", "json", "console"]

# Keys whose values must never reach a log line, at any depth (exact names, and any key
# ending in one of the suffixes: admin_token, client_secret, ...).
_SECRET_KEYS = frozenset(
    {"password", "token", "authorization", "x-auth-token", "secret", "cookie", "set-cookie"}
)
_SECRET_SUFFIXES = ("password", "passwd", "token", "secret", "api_key", "apikey")
REDACTED = "[redacted]"
# Credentials inside URLs: the userinfo of scheme://user:pass@host, and the values of
# query parameters that carry secrets (?token=..., &password=...).
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#@\s]+@")
_URL_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;](?:[A-Za-z0-9_.-]*(?:token|password|passwd|secret|api_key|apikey)"
    r"|key|sig|signature|auth|code)=)[^&;#\s'\"]*",
    re.IGNORECASE,
)
# Deeper than this, a value is dropped rather than walked (and never logged unchecked).
_MAX_DEPTH = 16


def _secret_key(key: object) -> bool:
    if not isinstance(key, str):
        return False
    k = key.lower()
    return k in _SECRET_KEYS or k.endswith(_SECRET_SUFFIXES)


def redact_text(text: str) -> str:
    """``text`` with URL credentials (userinfo, secret query values) replaced."""
    if "://" in text:
        text = _URL_USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)
    if "=" in text:
        text = _URL_SECRET_PARAM.sub(rf"\g<name>{REDACTED}", text)
    return text


def redact(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` with secret keys and URL credentials redacted, at any depth.

    Copies, never edits: the dicts and lists a caller logged stay as they were.
    """
    if isinstance(value, str):
        return redact_text(value)
    if depth >= _MAX_DEPTH and isinstance(value, dict | list | tuple):
        return "[too deep]"
    if isinstance(value, dict):
        return {k: REDACTED if _secret_key(k) else redact(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, depth + 1) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    # Any other object would be rendered by its repr (an exception's carries its
    # message): render it here, where its text can be checked.
    return redact_text(repr(value))


def _redact(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    for key, value in event.items():
        # structlog's own keys (_record, _from_structlog) are objects it needs intact.
        if key.startswith("_") and not isinstance(value, str | dict | list | tuple):
            continue
        event[key] = REDACTED if _secret_key(key) else redact(value)
    return event


def _kopf_extras(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """kopf attaches its whole settings object and an object reference to every record:
    keep the reference as our ``resource`` key and drop the rest."""
    event.pop("settings", None)
    event.pop("k8s_skip", None)
    ref = event.pop("k8s_ref", None)
    if isinstance(ref, dict) and ref.get("name"):
        event.setdefault("resource", ref["name"])
    return event


def configure(component: str, level: str = "info", fmt: Format = "auto") -> None:
    """Route structlog and the standard library's logging through one renderer."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: Any
    exceptions: Any
    if fmt == "console":
        renderer = structlog.dev.ConsoleRenderer()
        # A plain-text traceback under "exception", which the console renderer prints
        # after the line, and which _redact can check first.
        exceptions = structlog.processors.format_exc_info
    else:
        renderer = structlog.processors.JSONRenderer()
        # Structured: "exception" is a list of {exc_type, exc_value, frames}. No locals:
        # a frame's variables may hold credentials.
        exceptions = structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        exceptions,
        _redact,
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[structlog.stdlib.ExtraAdder(), _kopf_extras, *shared],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(component=component)


def get(name: str | None = None, **bound: Any) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger.bind(**bound) if bound else logger
