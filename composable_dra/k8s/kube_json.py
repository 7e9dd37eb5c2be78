"""Decoding the API server's JSON within its own limits, never deeper than our walks go.

The API server accepts a ResourceClaim whose opaque parameters (or a device's status
``data``) nest as deep as 10 KiB allows, about 5,000 levels, in a body of up to 10,000
levels (sigs.k8s.io/json). Python's ``json.loads`` raises RecursionError past about 1,000,
and a LIST is one document: one such claim would fail every LIST and watch of claims.
And whatever decodes, every walk after it (``freeze``, ``copy.deepcopy``, pydantic,
``json.dumps``, a log line) recurses too.

So every container nested deeper than ``MAX_DEPTH`` is replaced by ``TOO_DEEP``: the rest
of the object stays usable, and a reader that needs the cut part (our driver's config)
refuses it with a typed error. ``TOO_DEEP`` is not JSON, so a cut object can never be
written back by mistake. Fast path: ``json.loads`` and a walk bounded by ``MAX_DEPTH``;
a document too deep for ``json.loads`` is read from ijson's events (its yajl parser keeps
its own stack, so it has no recursion limit), building nothing below the cut.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Final

import ijson

# Several times the deepest object the suite reads (our CRDs' schemas: 14 levels; a
# claim's GpuConfig: 10), and a tenth of Python's recursion limit: any recursive walk of a
# decoded value (deepcopy: about two frames a level) stays well within it.
MAX_DEPTH: Final = 100


class TooDeep:
    """What stands for a container nested deeper than ``MAX_DEPTH`` levels."""

    __slots__ = ()
    _instance: TooDeep | None = None

    def __new__(cls) -> TooDeep:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return f"<nested deeper than {MAX_DEPTH} levels>"

    def __copy__(self) -> TooDeep:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> TooDeep:
        return self


TOO_DEEP: Final = TooDeep()


class DecodeError(ValueError):
    """A document too deep for ``json.loads`` that is not JSON either."""


def loads(raw: bytes | str) -> Any:
    """``raw`` decoded, with every container deeper than ``MAX_DEPTH`` cut to ``TOO_DEEP``.

    ValueError (json.JSONDecodeError, or DecodeError) for a document that is not JSON.
    """
    return decode(raw)[0]


def decode(raw: bytes | str) -> tuple[Any, bool]:
    """As ``loads``, and whether anything was cut."""
    try:
        value = json.loads(raw)
    except RecursionError:
        try:
            return _build(raw.encode() if isinstance(raw, str) else raw)
        except ijson.JSONError as exc:
            raise DecodeError(f"not JSON: {str(exc).splitlines()[0]}") from None
    cut = _cut(value, 1) if type(value) is dict or type(value) is list else False
    return value, cut


def _cut(value: Any, depth: int) -> bool:
    """Cut the containers below ``MAX_DEPTH`` in ``value``, a container ``depth`` levels
    down (fresh from json.loads: ours to change); whether any was cut. The hot path of
    every read: no call for a leaf, a write only where something is cut."""
    children = value.items() if type(value) is dict else enumerate(value)
    cut = False
    if depth >= MAX_DEPTH:
        for key, child in children:
            if type(child) is dict or type(child) is list:
                value[key] = TOO_DEEP
                cut = True
        return cut
    for _, child in children:
        if (type(child) is dict or type(child) is list) and _cut(child, depth + 1):
            cut = True
    return cut


def _build(raw: bytes) -> tuple[Any, bool]:
    """``raw`` from ijson's flat events, iteratively; below the cut only the depth is kept."""
    stack: list[Any] = []  # the open containers above the cut
    keys: list[str | None] = []  # the key each open dict's next value goes under
    below = 0  # open containers below the cut
    result: Any = None
    cut = False

    def put(value: Any) -> None:
        nonlocal result, cut
        cut = cut or value is TOO_DEEP
        if not stack:
            result = value
        elif type(stack[-1]) is list:
            stack[-1].append(value)
        else:
            stack[-1][keys[-1]] = value

    # Numbers as json.loads reads them: any int, else a float (ijson gives a Decimal; its
    # use_float overflows past 64-bit integers).
    for event, value in ijson.basic_parse(raw):
        if event in ("start_map", "start_array"):
            if below or len(stack) >= MAX_DEPTH:
                if not below:
                    put(TOO_DEEP)
                below += 1
                continue
            container: Any = {} if event == "start_map" else []
            put(container)
            stack.append(container)
            keys.append(None)
        elif event in ("end_map", "end_array"):
            if below:
                below -= 1
                continue
            stack.pop()
            keys.pop()
        elif below:
            continue
        elif event == "map_key":
            keys[-1] = value
        else:
            put(float(value) if isinstance(value, Decimal) else value)
    return result, cut


def cut_paths(value: Any, limit: int = 16) -> list[str]:
    """Where ``value`` (a decoded object) was cut, as JSONPath-like strings; at most
    ``limit`` of them. A walk bounded by ``MAX_DEPTH`` like the cut itself; a path is
    spelled only once found."""
    found: list[str] = []

    def walk(node: Any, where: tuple[Any, ...]) -> None:
        if node is TOO_DEEP and len(found) < limit:
            found.append(_spell(where))
        elif isinstance(node, dict):
            for key, child in node.items():
                if isinstance(child, dict | list) or child is TOO_DEEP:
                    walk(child, (where, key))
        elif isinstance(node, list):
            for i, child in enumerate(node):
                if isinstance(child, dict | list) or child is TOO_DEEP:
                    walk(child, (where, i))

    walk(value, ())
    return found


def _spell(where: tuple[Any, ...], steps: int = 12) -> str:
    """The path's first ``steps`` steps (a cut is at least ``MAX_DEPTH`` steps down)."""
    parts: list[str] = []
    while where:
        where, step = where
        parts.append(f"[{step}]" if isinstance(step, int) else f".{step}")
    parts.reverse()
    return "".join(parts[:steps]) + ("..." if len(parts) > steps else "") or "."
