"""The emulator's bounds: request bodies (JSON only, bounded in size and nesting, parsed
without surprises) and its runtime settings.

Whatever the bytes, :func:`parse_json` returns a value or raises ValueError: a body
nested thousands deep, ``NaN``/``Infinity`` (not JSON) or a number too long to convert
never escapes as another exception.
"""

from __future__ import annotations

import json
from typing import Any

MAX_BODY = 1024 * 1024  # bytes; Redfish requests here are a few hundred
MAX_DEPTH = 32  # the deepest request this service reads is 4 levels
# The largest value each runtime setting takes (from the CLI or PATCH /admin/config): a
# task that never ends or a Retry-After of days would only wedge the clients under test.
SETTING_MAX: dict[str, int] = {"async_polls": 1000, "retry_after": 3600, "task_seconds": 3600}
PAGE_SIZE_MAX = 100_000  # --page-size: members in one response of a collection


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def nesting(value: Any, limit: int = MAX_DEPTH) -> int:
    """How deep ``value`` nests (a scalar 0, ``[]`` 1), counted up to ``limit + 1``.

    Iterative: checking a deep value must not itself recurse.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``raw`` (UTF-8); ValueError naming the problem otherwise."""
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limits
        raise ValueError(str(exc)) from None
    if nesting(value, max_depth) > max_depth:
        raise ValueError(f"nested deeper than {max_depth}")
    return value
