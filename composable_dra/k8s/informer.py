"""A small informer: a cache of one kind of object kept current by list + watch.

The suite's one way to watch cluster state (docs/architecture.md, Rules for the Kubernetes
API). List, then watch from the list's resourceVersion with bookmarks; a watch that ends
resumes from the last resourceVersion seen; on 410 Gone relist at once. A watch that
fails otherwise is resumed from there too after the retry policy's wait
(composable_dra/k8s/retry.py): a watch from a version misses nothing (the server answers 410
when it would). Only when the resumed watch fails as well is the collection listed again
and the cache replaced. So after the first list, a full LIST is rare: a 410, or two
failed watches in a row.

Every change calls ``on_change`` (the controllers use it to wake their reconcile loop);
``on_event(type, obj)`` hears of each object that was added, modified or deleted, a relist's
differences included (work queues keyed by object use it). Controllers read the cache
instead of listing on every pass; benches and tests wait on it with ``wait_for``.

Readers get the cached objects themselves, not copies: the watch replaces an object, never
changes it, and each is stored frozen (composable_dra/k8s/frozen.py: a change raises
``ReadOnlyError``; ``copy.deepcopy`` gives a changeable copy). ``metadata.managedFields``
is dropped on the way in (no reader needs it; it is a large share of each object).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from composable_dra.k8s import retry
from composable_dra.k8s.frozen import FrozenDict, freeze
from composable_dra.k8s.kube import JSON, LIST_PAGE, Gone, Kube, NotFound, list_pages
from composable_dra.process import logs

log = logs.get(__name__)

T = TypeVar("T")
OnEvent = Callable[[str, JSON], None]


def object_key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def cached_form(obj: JSON) -> JSON:
    """What the cache keeps of ``obj``: frozen, without ``metadata.managedFields``."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    frozen: FrozenDict = freeze(obj)
    return frozen


def _rv(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Informer:
    """Cache of the objects at ``url_path`` (with optional selectors), kept by a thread.

    ``query``: the list's and watch's parameters (``fieldSelector``, ``labelSelector``).
    ``missing_ok``: a resource the server does not serve (404: no CRD) counts as an empty,
    synced list, asked again after the retry policy's wait. ``retry_cap``: the longest
    wait between failed rounds, seconds. ``keep``: the part of each object worth caching
    (the fields its readers use), for large collections.
    """

    def __init__(
        self,
        kube: Kube,
        url_path: str,
        on_change: Callable[[], None] | None = None,
        *,
        on_event: OnEvent | None = None,
        name: str = "",
        watch_timeout: int = 240,
        retry_cap: float = 5.0,
        missing_ok: bool = False,
        keep: Callable[[JSON], JSON] | None = None,
        **query: Any,
    ) -> None:
        self._kube = kube
        self._path = url_path
        self._query = query
        self._on_change = on_change or (lambda: None)
        self._on_event = on_event
        self._watch_timeout = watch_timeout
        self._retry_cap = retry_cap
        self._missing_ok = missing_ok
        self._keep = keep
        self._watch_failed = False  # the last round's watch failed: resumed once, then relist
        self.name = name or url_path.rsplit("/", 1)[-1]
        self._lock = threading.Condition()
        self._items: dict[str, JSON] = {}
        self._rv = ""  # where the next watch starts; "" relists first
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()

    def start(self) -> Informer:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread at its next event or watch timeout (it is a daemon thread)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def items(self) -> list[JSON]:
        """The cached objects now, read-only (``copy.deepcopy`` one to change it)."""
        with self._lock:
            return list(self._items.values())

    def cached_keys(self) -> list[str]:
        with self._lock:
            return list(self._items)

    def get(self, key: str) -> JSON | None:
        """The cached object at ``key`` (read-only), or None."""
        with self._lock:
            return self._items.get(key)

    def wait_for(self, predicate: Callable[[list[JSON]], T], timeout: float) -> T:
        """The first truthy ``predicate(items)``, checked on every change of the cache.

        TimeoutError after ``timeout`` seconds (with the last answer), or once stopped.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                answer = predicate(list(self._items.values()))
                if answer:
                    return answer
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    raise TimeoutError(
                        f"{self.name}: condition not met within {timeout}s (last: {answer!r})"
                    )
                self._lock.wait(left)

    def replace(self, items: list[JSON]) -> None:
        """Make the cache ``items``, as a relist does: events for the differences."""
        self._replace({object_key(o): self._cached(o) for o in items})

    def _replace(self, fresh: dict[str, JSON]) -> None:
        with self._lock:
            old, self._items = self._items, fresh
            self._lock.notify_all()
        self.synced.set()
        if self._on_event is not None:
            for key, obj in fresh.items():
                before = old.get(key)
                if before is None:
                    self._on_event("ADDED", obj)
                elif _rv(before) != _rv(obj) or not _rv(obj):
                    self._on_event("MODIFIED", obj)
            for key, obj in old.items():
                if key not in fresh:
                    self._on_event("DELETED", obj)
        self._on_change()

    def _cached(self, obj: JSON) -> JSON:
        return cached_form(self._keep(obj) if self._keep is not None else obj)

    def _apply(self, kind: str, obj: JSON) -> None:
        key = object_key(obj)
        obj = self._cached(obj)
        with self._lock:
            if kind == "DELETED":
                self._items.pop(key, None)
            else:
                self._items[key] = obj
            self._lock.notify_all()
        if self._on_event is not None:
            self._on_event(kind, obj)
        self._on_change()

    def _relist(self) -> None:
        """List in pages (kube.list_pages), each cut to what the cache keeps before the
        next is read: a relist of 9,000 claims never holds them all whole at once."""
        fresh: dict[str, JSON] = {}
        meta: JSON = {}
        try:
            for body in list_pages(self._kube, self._path, LIST_PAGE, **self._query):
                for o in body.get("items") or []:
                    fresh[object_key(o)] = self._cached(o)
                meta = body.get("metadata") or {}
        except NotFound:
            if not self._missing_ok:
                raise
            self.replace([])
            raise
        self._replace(fresh)
        self._rv = str(meta.get("resourceVersion", ""))

    def _round(self) -> None:
        """List if need be, then watch until the watch ends; raises on failure."""
        try:
            if not self._rv:
                self._relist()
            for event in self._kube.watch(
                self._path, self._rv, timeout_seconds=self._watch_timeout, **self._query
            ):
                if self._stop.is_set():
                    return
                obj = event.get("object") or {}
                kind = str(event.get("type"))
                if kind != "BOOKMARK":
                    self._apply(kind, obj)
                # Only once applied: a watch resumed after a failure gets it again.
                self._rv = _rv(obj) or self._rv
                self._watch_failed = False
            self._watch_failed = False
        except Gone:
            self._rv = ""  # too old: relist now
        except Exception:
            if self._watch_failed:
                self._rv = ""  # resumed and failed again: relist
            self._watch_failed = bool(self._rv)
            raise

    def _log_failure(self, exc: BaseException, retry_in: float) -> None:
        if isinstance(exc, NotFound) and self._missing_ok:
            log.info("resource not served; asking again", resource=self.name, retry_in=retry_in)
        else:
            log.warning(
                "watch failed",
                resource=self.name,
                error=str(exc),
                retry_in=retry_in,
                then="resume" if self._rv else "relist",
            )

    def _run(self) -> None:
        while not self._stop.is_set():
            retry.forever(self._round, self._stop, cap=self._retry_cap, on_error=self._log_failure)


# A controller whose pass costs O(cluster) rests after each pass, longer the dearer the
# pass: took / PASS_REST_UNIT times as long as it took, ``took`` being the pass's own CPU
# time (its thread's; not the wall time of the writes it waits for), at most PASS_REST_CAP
# seconds. During a burst events come faster than passes, so the rest sets the pass rate,
# and so the controller's CPU, where the scheduler, which sets a burst's pace, needs the
# cores. At 1,000 nodes (passes of 13-27 ms of CPU) a pass rests 13-27 times as long: the
# scaler had 45 s of CPU in a 1,000-claim burst passing back to back, 25 s resting 4 times
# a pass. A small cluster's pass of a millisecond or two rests about as long again: each
# hop of an attach waits on a pass (a fixed 16 times the wall time made the scaler's share
# of time_to_gpu.py --claims 20 twice as long).
PASS_REST_UNIT = 0.001
PASS_REST_CAP = 1.0


def rest_after(took: float) -> float:
    """Seconds to rest after a pass that took ``took``."""
    return max(0.0, min(took * took / PASS_REST_UNIT, PASS_REST_CAP))


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
        self._executors: list[ThreadPoolExecutor] = []

    def _executor(self, workers: int, name: str) -> ThreadPoolExecutor:
        """A thread pool for the controller's writes; stop() drops what it has queued."""
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._executors.append(pool)
        return pool

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
        for pool in self._executors:
            pool.shutdown(wait=False, cancel_futures=True)

    def wait_synced(self) -> bool:
        """Until every informer has listed once; False when stopped first."""
        for inf in self.informers:
            while not inf.synced.wait(0.5):
                if self._stop.is_set():
                    return False
        return True

    def _loop(self) -> None:
        raise NotImplementedError

    def _debounced_passes(
        self,
        one_pass: Callable[[], None],
        *,
        every: Callable[[], float],
        debounce: float,
        on_error: retry.OnError,
        rest: bool = False,
    ) -> None:
        """A ``_loop``: once synced, ``one_pass`` on each wake, or ``every()`` seconds
        after the last; a burst of changes within ``debounce`` makes one pass, and a
        failed pass is retried (cap 10 s) until it succeeds or the controller stops.
        With ``rest``, each pass is followed by ``rest_after`` its CPU time."""
        if not self.wait_synced():
            return
        while not self._stop.is_set():
            self._wake.wait(every())
            if self._stop.is_set():
                return
            self._stop.wait(debounce)  # let a burst of events settle into one pass
            self._wake.clear()
            started = time.thread_time()
            retry.forever(one_pass, self._stop, cap=10.0, first=0.5, on_error=on_error)
            if rest:
                self._stop.wait(rest_after(time.thread_time() - started))
