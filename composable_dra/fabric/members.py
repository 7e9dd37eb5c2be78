"""Reading a Redfish collection the way the specification lets a large one be read.

A fabric manager with thousands of resource blocks answers a collection in pages
(``Members@odata.nextLink``) and, where its ServiceRoot says so in
``ProtocolFeaturesSupported.ExpandQuery``, inlines the members themselves (``$expand``):
a read of N members then takes one request per page instead of N + 1. A service that
does not advertise ``$expand`` gets plain reads, and every member it did not inline is
read on its own, so both kinds of service give the same result.

The next-page link comes from the service, so it is checked before it is followed: it
must stay on the same service (a relative path, or an absolute URL of the same scheme,
host and port) under ``/redfish/v1/``, never repeat a link already followed (a loop) and
the pages are bounded in number. Anything else is a :class:`PagingError`.
"""

from __future__ import annotations

import posixpath
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROOT = "/redfish/v1"
MAX_PAGES = 10_000  # pages of one collection: far above any real fabric's inventory

Get = Callable[[str], dict[str, Any]]


class PagingError(ValueError):
    """A collection's next-page link that a client must not follow."""


@dataclass(frozen=True)
class Expand:
    """How this service inlines a collection's members: the ``$expand`` value to ask for
    (None: it does not advertise ``$expand``) and the most ``$levels`` it takes (0: no
    ``$levels``, one level only)."""

    how: str | None
    max_levels: int = 0


NO_EXPAND = Expand(None)


def expand_of(service_root: dict[str, Any]) -> Expand:
    """What the ServiceRoot advertises: ``.`` (hyperlinks outside ``Links``, where a
    collection's members are) if it can, else ``*``; ``$levels`` only if supported."""
    features = service_root.get("ProtocolFeaturesSupported")
    expand = features.get("ExpandQuery") if isinstance(features, dict) else None
    if not isinstance(expand, dict):
        return NO_EXPAND
    if expand.get("NoLinks") is True:
        how = "."
    elif expand.get("ExpandAll") is True:
        how = "*"
    else:
        return NO_EXPAND
    levels = expand.get("MaxLevels")
    if expand.get("Levels") is True and isinstance(levels, int) and levels >= 1:
        return Expand(how, levels)
    return Expand(how)


def query(expand: Expand, levels: int = 1) -> str:
    """The query string (with its ``?``) that inlines up to ``levels`` levels, as far as
    the service allows; empty without ``$expand``."""
    if expand.how is None:
        return ""
    if expand.max_levels == 0:
        return f"?$expand={expand.how}"
    return f"?$expand={expand.how}($levels={max(1, min(levels, expand.max_levels))})"


def next_page(collection_uri: str, link: Any, endpoint: str, seen: set[str]) -> str:
    """The path (with its query) to read the next page from, or :class:`PagingError`."""
    if not isinstance(link, str) or not link:
        raise PagingError(f"{collection_uri}: Members@odata.nextLink is not a URI: {link!r}")
    parts = urllib.parse.urlsplit(link)
    if parts.scheme or parts.netloc:
        base = urllib.parse.urlsplit(endpoint)
        if (parts.scheme, parts.netloc) != (base.scheme, base.netloc):
            raise PagingError(
                f"{collection_uri}: next page {link!r} is on another service than {endpoint}"
            )
    path = urllib.parse.unquote(parts.path)
    if posixpath.normpath(path) != path.rstrip("/") or not path.startswith(f"{ROOT}/"):
        raise PagingError(f"{collection_uri}: next page {link!r} is outside {ROOT}/")
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    if target in seen:
        raise PagingError(f"{collection_uri}: next page {link!r} was read already (a loop)")
    if len(seen) >= MAX_PAGES:
        raise PagingError(f"{collection_uri}: more than {MAX_PAGES} pages")
    seen.add(target)
    return target


def members(
    get: Get, uri: str, endpoint: str, expand: Expand = NO_EXPAND, levels: int = 1
) -> list[dict[str, Any]]:
    """The members of the collection at ``uri``, each as a GET of it answers (inlined
    ``levels`` deep where the service can) and with its ``@odata.id``, following every
    next-page link."""
    out: list[dict[str, Any]] = []
    path = uri + query(expand, levels)
    seen = {path}
    while True:
        page = get(path)
        for member in page.get("Members", []):
            uri_of = member.get("@odata.id") if isinstance(member, dict) else None
            if not isinstance(uri_of, str):
                continue
            if len(member) == 1:  # only the link: the service did not inline this one
                member = {"@odata.id": uri_of, **get(uri_of)}
            out.append(member)
        link = page.get("Members@odata.nextLink")
        if link is None:
            return out
        path = next_page(uri, link, endpoint, seen)
