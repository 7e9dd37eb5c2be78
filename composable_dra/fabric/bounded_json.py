"""JSON from a peer, parsed without surprises: what the fabric backends read of a fabric
manager and what the fabric emulator reads of its clients.

Whatever the bytes, :func:`loads` returns a value or raises ValueError: a body nested
thousands deep (RecursionError in ``json``), ``NaN``/``Infinity`` or a number that
overflows to infinity (not JSON numbers; an infinite token lifetime or wait is nonsense),
a number too long to convert, bytes that are not UTF-8.
"""

from __future__ import annotations

import json
import math
from typing import Any


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} overflows")
    return value


def nesting(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar 0, ``[]`` 1), counted up to ``limit + 1``.

    Iterative: checking a deep value must not itself recurse.
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack and deepest <= limit:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend(
                (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def loads(raw: bytes, max_depth: int) -> Any:
    """The JSON value of ``raw`` (UTF-8); ValueError naming the problem otherwise."""
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth}") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digit limits
        raise ValueError(str(exc)) from None
    if nesting(value, max_depth) > max_depth:
        raise ValueError(f"nested deeper than {max_depth}")
    return value
