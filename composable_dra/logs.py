"""One logging setup for every component: structlog, JSON by default, readable on a TTY.

Bound keys follow DESIGN.md (component, node, claim, resource, fabric, device, phase).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

Format = Literal["auto", "json", "console"]

# Keys whose values must never reach a log line.
_SECRET_KEYS = frozenset({"password", "token", "authorization", "x-auth-token", "secret"})


def _redact(_logger: Any, _method: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in event:
        if key.lower() in _SECRET_KEYS:
            event[key] = "[redacted]"
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
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if fmt == "console" else structlog.processors.JSONRenderer()
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
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
