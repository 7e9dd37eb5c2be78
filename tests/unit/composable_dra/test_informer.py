"""composable_dra.k8s.informer: list + watch into a cache, events, resume, relist, wait_for."""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from composable_dra.k8s.frozen import ReadOnlyError
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Gone, NotFound
from testbed.wait import wait_for

END = object()  # ends the current watch, as the server's timeout does


def pod(name: str, rv: str, **spec: Any) -> JSON:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "spec": spec}


class FakeKube:
    """A LIST answer and a feed of watch events; records where each watch started."""

    def __init__(self, items: list[JSON], rv: str = "10") -> None:
        self.items, self.rv = items, rv
        self.lists: list[dict[str, Any]] = []
        self.watches: list[str] = []
        self.events: queue.Queue[Any] = queue.Queue()
        self.list_error: Exception | None = None

    def get(self, url_path: str, **query: Any) -> JSON:
        self.lists.append(query)
        if self.list_error is not None:
            raise self.list_error
        return {"items": list(self.items), "metadata": {"resourceVersion": self.rv}}

    def watch(
        self, url_path: str, resource_version: str, timeout_seconds: int = 60, **query: Any
    ) -> Iterator[JSON]:
        self.watches.append(resource_version)
        while True:
            event = self.events.get(timeout=10)
            if event is END:
                return
            if isinstance(event, Exception):
                raise event
            yield event


@contextlib.contextmanager
def started(kube: FakeKube, **kwargs: Any) -> Iterator[tuple[Informer, list[tuple[str, str]]]]:
    """A running informer on ``kube``, stopped (and its watch ended) afterwards."""
    seen: list[tuple[str, str]] = []
    inf = Informer(
        kube,  # type: ignore[arg-type]
        "/api/v1/pods",
        on_event=lambda kind, obj: seen.append((kind, obj["metadata"]["name"])),
        retry_cap=0.05,
        fieldSelector="spec.nodeName=n1",
        **kwargs,
    ).start()
    try:
        yield inf, seen
    finally:
        inf.stop()
        kube.events.put(END)


def names(items: list[JSON]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in items)


def test_list_then_events_keep_the_cache_and_tell_each_change() -> None:
    kube = FakeKube([pod("a", "5")])
    with started(kube) as (inf, seen):
        assert inf.synced.wait(5)
        assert kube.lists == [{"fieldSelector": "spec.nodeName=n1", "limit": 500}]
        kube.events.put({"type": "ADDED", "object": pod("b", "11")})
        kube.events.put({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}})
        kube.events.put({"type": "DELETED", "object": pod("a", "13")})
        assert inf.wait_for(lambda items: names(items) == ["b"], 5)
        assert seen == [("ADDED", "a"), ("ADDED", "b"), ("DELETED", "a")]
        assert inf.get("ns/b") is not None and inf.cached_keys() == ["ns/b"]


def test_an_ended_watch_resumes_from_the_last_version_seen_without_relisting() -> None:
    kube = FakeKube([])
    with started(kube) as (inf, _):
        kube.events.put({"type": "ADDED", "object": pod("b", "11")})
        kube.events.put({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}})
        kube.events.put(END)
        kube.events.put({"type": "ADDED", "object": pod("c", "13")})
        inf.wait_for(lambda items: "c" in names(items), 5)
        assert kube.watches == ["10", "12"] and len(kube.lists) == 1


def test_gone_relists_and_a_relist_tells_only_the_differences() -> None:
    kube = FakeKube([pod("a", "5"), pod("b", "6")])
    with started(kube) as (inf, seen):
        assert inf.synced.wait(5)
        kube.items, kube.rv = [pod("a", "5"), pod("c", "20"), pod("b", "21")], "22"
        kube.events.put(Gone(410, "Expired", "too old"))
        inf.wait_for(lambda items: "c" in names(items), 5)
        assert kube.watches == ["10", "22"]
        assert seen[2:] == [("ADDED", "c"), ("MODIFIED", "b")]


def test_a_failed_watch_resumes_and_relists_only_when_the_resumed_one_fails_too() -> None:
    kube = FakeKube([pod("a", "5")])
    with started(kube) as (inf, seen):
        assert inf.synced.wait(5)
        kube.events.put({"type": "ADDED", "object": pod("b", "11")})
        kube.events.put(ConnectionError("reset"))
        kube.events.put({"type": "ADDED", "object": pod("c", "12")})
        inf.wait_for(lambda items: "c" in names(items), 5)
        assert kube.watches == ["10", "11"] and len(kube.lists) == 1  # resumed, no list
        kube.items = []
        kube.events.put(ConnectionError("reset"))
        kube.events.put(ConnectionError("reset again"))  # the resumed watch fails too
        inf.wait_for(lambda items: items == [], 5)
        assert kube.watches == ["10", "11", "12", "10"] and len(kube.lists) == 2
        assert seen[-3:] == [("DELETED", "a"), ("DELETED", "b"), ("DELETED", "c")]


def test_a_resource_not_served_is_an_empty_synced_cache_when_allowed() -> None:
    kube = FakeKube([])
    kube.list_error = NotFound(404, "NotFound", "no CRD")
    with started(kube, missing_ok=True) as (inf, _):
        assert inf.synced.wait(5) and inf.items() == []
        kube.list_error = None
        kube.items = [pod("a", "30")]
        inf.wait_for(lambda items: names(items) == ["a"], 5)  # asked again later


def test_a_resource_not_served_is_not_synced_by_default() -> None:
    kube = FakeKube([])
    kube.list_error = NotFound(404, "NotFound", "no CRD")
    with started(kube) as (inf, _):
        assert not inf.synced.wait(0.3)


def test_wait_for_times_out_with_the_last_answer() -> None:
    inf = Informer(FakeKube([]), "/api/v1/pods")  # type: ignore[arg-type]
    inf.replace([pod("a", "1")])
    with pytest.raises(TimeoutError, match=r"within 0\.1s"):
        inf.wait_for(lambda items: len(items) == 2, 0.1)
    assert inf.wait_for(lambda items: len(items), 0.1) == 1


def test_wait_for_wakes_on_a_change_from_another_thread() -> None:
    inf = Informer(FakeKube([]), "/api/v1/pods")  # type: ignore[arg-type]
    threading.Timer(0.1, inf.replace, args=([pod("a", "1")],)).start()
    assert inf.wait_for(lambda items: names(items) == ["a"], 5)


def test_readers_share_the_cached_objects_and_nothing_is_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A copy per read made every controller pass O(cluster) (docs/attach-flow.md, Scale).
    inf = Informer(FakeKube([]), "/api/v1/pods")  # type: ignore[arg-type]
    inf.replace([pod(f"p{i}", str(i)) for i in range(50)])
    copies: list[object] = []
    real = copy.deepcopy

    def spy(obj: object, *args: Any) -> object:
        copies.append(obj)
        return real(obj, *args)

    monkeypatch.setattr(copy, "deepcopy", spy)
    first, again = inf.items(), inf.items()
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert inf.get("ns/p3") is inf.get("ns/p3")
    assert inf.wait_for(lambda items: items[0] is first[0], 1)
    assert copies == []


def test_cached_objects_are_read_only_and_a_deep_copy_may_change() -> None:
    inf = Informer(FakeKube([]), "/api/v1/pods")  # type: ignore[arg-type]
    inf.replace([pod("a", "1", containers=[{"name": "c"}])])
    cached = inf.get("ns/a")
    assert cached is not None
    with pytest.raises(ReadOnlyError):
        cached["spec"]["containers"][0]["name"] = "other"
    with pytest.raises(ReadOnlyError):
        cached["metadata"].setdefault("labels", {})
    mine = copy.deepcopy(cached)
    mine["spec"]["containers"].append({"name": "d"})
    assert inf.get("ns/a") == pod("a", "1", containers=[{"name": "c"}])


def test_managed_fields_are_not_cached() -> None:
    kube = FakeKube([])
    with started(kube) as (inf, _):
        obj = pod("a", "11")
        obj["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
        kube.events.put({"type": "ADDED", "object": obj})
        inf.wait_for(lambda items: names(items) == ["a"], 5)
        assert inf.get("ns/a") == pod("a", "11")


def test_keep_caches_only_the_fields_asked_for() -> None:
    def keep(obj: JSON) -> JSON:
        return {"metadata": obj["metadata"]}

    inf = Informer(FakeKube([]), "/api/v1/pods", keep=keep)  # type: ignore[arg-type]
    inf.replace([pod("a", "1", nodeName="n1")])
    assert inf.items() == [{"metadata": pod("a", "1")["metadata"]}]


class PagingKube(FakeKube):
    """Answers a LIST ``limit`` objects at a time, as the API server does, and logs each
    page it serves."""

    def __init__(self, items: list[JSON], log: list[str]) -> None:
        super().__init__(items)
        self.log = log

    def get(self, url_path: str, **query: Any) -> JSON:
        self.lists.append(query)
        start = int(query.get("continue") or 0)
        end = start + int(query["limit"])
        self.log.append(f"page {start}")
        meta = {"resourceVersion": self.rv} | (
            {"continue": str(end)} if end < len(self.items) else {}
        )
        return {"items": self.items[start:end], "metadata": meta}


def test_a_list_is_read_in_pages_each_cut_to_what_is_kept_before_the_next() -> None:
    log: list[str] = []
    kube = PagingKube([pod(f"p{i:04}", str(i), big="x" * 100) for i in range(1203)], log)

    def keep(obj: JSON) -> JSON:
        log.append("keep")
        return {"metadata": obj["metadata"]}

    with started(kube, keep=keep) as (inf, seen):
        assert inf.synced.wait(5)
        assert [q.get("continue") for q in kube.lists] == [None, "500", "1000"]
        assert {q["limit"] for q in kube.lists} == {500}
        # Each page is kept (cut) before the next page is asked for.
        pages = [i for i, entry in enumerate(log) if entry.startswith("page")]
        assert [log[i + 1 : i + 501].count("keep") for i in pages] == [500, 500, 203]
        assert len(inf.items()) == 1203 and "spec" not in inf.items()[0]
        # The watch starts after synced is set: wait for it (a loaded machine lags).
        assert wait_for(lambda: kube.watches, 5, "the watch after the list")
        assert len(seen) == 1203 and kube.watches[:1] == ["10"]
