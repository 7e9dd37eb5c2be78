"""Redfish query parameters on GET (DSP0266 "Query parameters"): ``$expand``, ``$top`` and
``$skip``, and server-driven paging of large collections (pure functions).

What the service does, as the ServiceRoot's ``ProtocolFeaturesSupported`` says:

- ``$expand=*``, ``.`` or ``~``, optionally ``($levels=N)``, N up to ``MAX_LEVELS``
  (default 1): each hyperlink (an object that holds only ``@odata.id``) is replaced by
  the resource it names, as a GET of it would answer: ``*`` all of them, ``.`` those
  outside ``Links``, ``~`` those inside ``Links``; with N > 1 the inlined resources'
  hyperlinks in turn. A collection's ``Members`` are outside ``Links``, so
  ``$expand=.`` reads a page of members in one request.
- ``$skip`` and ``$top`` on a collection: the members after the first ``$skip``, at most
  ``$top`` of them. ``Members@odata.count`` stays the collection's size.
- A collection answers at most ``page_size`` members at a time; when more were asked
  for, ``Members@odata.nextLink`` is the URI (this service's path, same query) of the
  rest.

Other query parameters that start with ``$`` are refused with 501 (the specification's
rule for unsupported ones); parameters without ``$`` are ignored. A malformed or
repeated value is 400.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fabric_emulator import messages
from fabric_emulator.state import RedfishError

# Two levels: a page of resource blocks with each block's GPU Processor, in one request.
MAX_LEVELS = 2
DEFAULT_PAGE_SIZE = 1000
_MAX_DIGITS = 9  # $top/$skip: a collection here never holds a billion members
_EXPAND = re.compile(r"([*.~])(?:\(\$levels=([0-9]{1,9})\))?")
_SUPPORTED = ("$expand", "$skip", "$top")

Resolve = Callable[[str], dict[str, Any] | None]


@dataclass(frozen=True)
class Query:
    expand: str | None = None  # "*", "." or "~"
    levels: int = 1
    skip: int = 0
    top: int | None = None
    raw_expand: str | None = None  # as given, for the next page's link

    @property
    def pages(self) -> bool:
        return self.skip > 0 or self.top is not None


def _count(name: str, value: str, minimum: int) -> int:
    if not value.isascii() or not value.isdigit():
        raise RedfishError(400, messages.base("QueryParameterValueFormatError", value, name))
    if len(value) > _MAX_DIGITS or int(value) < minimum:
        bounds = f"{minimum} to {10**_MAX_DIGITS - 1}"
        raise RedfishError(400, messages.base("QueryParameterOutOfRange", value, name, bounds))
    return int(value)


def parse(pairs: Sequence[tuple[str, str]]) -> Query:
    """The query of a GET from its decoded (name, value) pairs, or a :class:`RedfishError`
    to answer instead."""
    seen: dict[str, str] = {}
    for name, value in pairs:
        if not name.startswith("$"):
            continue  # the specification: ignore unknown parameters without "$"
        if name not in _SUPPORTED:
            raise RedfishError(501, messages.base("QueryParameterUnsupported", name))
        if name in seen:
            raise RedfishError(400, messages.base("QueryParameterValueFormatError", value, name))
        seen[name] = value
    expand, levels = None, 1
    raw = seen.get("$expand")
    if raw is not None:
        m = _EXPAND.fullmatch(raw)
        if m is None:
            raise RedfishError(400, messages.base("QueryParameterValueFormatError", raw, "$expand"))
        if m[2] is not None and not 1 <= int(m[2]) <= MAX_LEVELS:
            raise RedfishError(
                400,
                messages.base("QueryParameterOutOfRange", m[2], "$levels", f"1 to {MAX_LEVELS}"),
            )
        expand, levels = m[1], int(m[2] or 1)
    skip = _count("$skip", seen["$skip"], 0) if "$skip" in seen else 0
    top = _count("$top", seen["$top"], 1) if "$top" in seen else None
    return Query(expand=expand, levels=levels, skip=skip, top=top, raw_expand=raw)


def page(payload: dict[str, Any], q: Query, page_size: int) -> dict[str, Any]:
    """The part of a collection ``q`` and the page size let one response hold, with the
    link to the rest. A resource that is no collection takes no ``$skip``/``$top``."""
    members = payload.get("Members")
    if not isinstance(members, list):
        if q.pages:
            raise RedfishError(400, messages.base("QueryNotSupportedOnResource"))
        return payload
    stop = len(members) if q.top is None else min(len(members), q.skip + q.top)
    served = min(stop, q.skip + page_size)
    out = {**payload, "Members": members[q.skip : served]}
    out.pop("Members@odata.nextLink", None)
    if served < stop:
        params: dict[str, str | int] = {"$skip": served}
        if q.top is not None:
            params["$top"] = stop - served
        if q.raw_expand is not None:
            params["$expand"] = q.raw_expand
        out["Members@odata.nextLink"] = f"{payload['@odata.id']}?{urlencode(params, safe='$()*=')}"
    return out


def expand(
    payload: dict[str, Any], how: str | None, levels: int, resolve: Resolve
) -> dict[str, Any]:
    """``payload`` with the hyperlinks that ``how`` selects replaced by what ``resolve``
    renders for them (those it renders nothing for stay links), ``levels`` deep: the
    inlined resources have theirs replaced in turn."""
    if how is None or levels < 1:
        return payload
    done: dict[tuple[str, int], dict[str, Any]] = {}  # one render per resource and depth

    def inline(uri: str, depth: int) -> dict[str, Any] | None:
        if (uri, depth) not in done:
            found = resolve(uri)
            if found is None:
                return None
            done[uri, depth] = resource(found, depth - 1) if depth > 1 else found
        return done[uri, depth]

    def walk(node: Any, in_links: bool, depth: int) -> Any:
        if isinstance(node, list):
            return [walk(item, in_links, depth) for item in node]
        if not isinstance(node, dict):
            return node
        uri = node.get("@odata.id")
        if len(node) == 1 and isinstance(uri, str) and (how == "*" or (how == "~") == in_links):
            return inline(uri, depth) or node
        return {k: walk(v, in_links or k == "Links", depth) for k, v in node.items()}

    def resource(node: dict[str, Any], depth: int) -> dict[str, Any]:
        return {k: walk(v, k == "Links", depth) for k, v in node.items()}

    return resource(payload, levels)
