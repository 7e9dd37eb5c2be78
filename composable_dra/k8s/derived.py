"""Values derived from an informer's objects, kept while the objects are.

An informer replaces an object that changed and keeps the same (frozen) object otherwise,
so what a controller derives from each object on every pass can be kept by object: a pass
over 9,000 claims then derives again only for the few that changed since the last one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from composable_dra.k8s.kube import JSON

T = TypeVar("T")


class Derived(Generic[T]):
    """``fn(obj)`` for each object, computed again only for objects not seen last time.

    It holds the objects of its last ``map``, so an ``id`` is never reused while kept;
    objects gone since then are dropped. For one thread (a controller's pass)."""

    def __init__(self, fn: Callable[[JSON], T]) -> None:
        self._fn = fn
        self._kept: dict[int, tuple[JSON, T]] = {}

    def map(self, objs: Iterable[JSON]) -> list[T]:
        kept, fresh = self._kept, {}
        out = []
        for obj in objs:
            hit = kept.get(id(obj))
            if hit is None or hit[0] is not obj:
                hit = (obj, self._fn(obj))
            fresh[id(obj)] = hit  # the same pair again: a pass allocates for changes only
            out.append(hit[1])
        self._kept = fresh
        return out
