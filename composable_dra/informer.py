"""A small informer: a cache of one kind of object kept current by list + watch.

List, then watch from the list's resourceVersion with bookmarks; on 410 Gone or a broken
watch, relist and replace the cache, so a missed event never leaves it stale for long.
Every change calls ``on_change`` (the controllers use it to wake their reconcile loop),
and controllers read the cache instead of listing on every pass.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

from composable_dra import logs
from composable_dra.kube import JSON, Gone, Kube

log = logs.get(__name__)


def object_key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


class Informer:
    """Cache of the objects at ``url_path`` (with optional selectors), kept by a thread."""

    def __init__(
        self,
        kube: Kube,
        url_path: str,
        on_change: Callable[[], None] | None = None,
        *,
        name: str = "",
        watch_timeout: int = 240,
        **query: Any,
    ) -> None:
        self._kube = kube
        self._path = url_path
        self._query = query
        self._on_change = on_change or (lambda: None)
        self._watch_timeout = watch_timeout
        self.name = name or url_path.rsplit("/", 1)[-1]
        self._lock = threading.Lock()
        self._items: dict[str, JSON] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def items(self) -> list[JSON]:
        """A snapshot of the cached objects (copies: callers may keep or change them)."""
        with self._lock:
            return [copy.deepcopy(o) for o in self._items.values()]

    def get(self, key: str) -> JSON | None:
        with self._lock:
            obj = self._items.get(key)
            return copy.deepcopy(obj) if obj is not None else None

    def _relist(self) -> str:
        body = self._kube.get(self._path, **self._query)
        fresh = {object_key(o): o for o in body.get("items") or []}
        with self._lock:
            self._items = fresh
        self.synced.set()
        self._on_change()
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            try:
                rv = self._relist()
                backoff = 0.2
                for event in self._kube.watch(
                    self._path, rv, timeout_seconds=self._watch_timeout, **self._query
                ):
                    if self._stop.is_set():
                        return
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "BOOKMARK":
                        continue
                    key = object_key(obj)
                    with self._lock:
                        if kind == "DELETED":
                            self._items.pop(key, None)
                        else:
                            self._items[key] = obj
                    self._on_change()
            except Gone:
                continue
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("watch failed; relisting", resource=self.name, error=str(exc))
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)


class InformerDriven:
    """A controller thread fed by informers: they start and stop together.

    Subclasses fill ``self.informers`` (their changes set ``self._wake``) and implement
    ``_loop``, which begins with ``if not self.wait_synced(): return``.
    """

    thread_name = "controller"

    def __init__(self) -> None:
        self.informers: list[Informer] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        for inf in self.informers:
            inf.start()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for inf in self.informers:
            inf.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wait_synced(self) -> bool:
        """Until every informer has listed once; False when stopped first."""
        for inf in self.informers:
            while not inf.synced.wait(0.5):
                if self._stop.is_set():
                    return False
        return True

    def _loop(self) -> None:
        raise NotImplementedError
