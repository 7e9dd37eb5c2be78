"""How the two slice writers write (composable_dra/k8s/resource_slices.py): an update from
the copy they saw, keeping what others set; an apply when that copy is stale or absent."""

from __future__ import annotations

from typing import Any

from composable_dra.k8s.frozen import freeze
from composable_dra.k8s.kube import JSON, Conflict, NotFound
from composable_dra.k8s.resource_slices import write_slices


class RecordingKube:
    def __init__(self, refuse: type[Exception] | None = None) -> None:
        self.calls: list[tuple[str, str, JSON]] = []
        self.refuse = refuse

    def replace(self, url: str, body: JSON, manager: str) -> JSON:
        self.calls.append(("replace", url.rsplit("/", 1)[-1], body))
        if self.refuse is not None:
            raise self.refuse(409, "Conflict", "changed")
        return body

    def apply(self, url: str, body: JSON, manager: str) -> JSON:
        self.calls.append(("apply", url.rsplit("/", 1)[-1], body))
        return body

    def delete(self, url: str) -> None:
        self.calls.append(("delete", url.rsplit("/", 1)[-1], {}))


def ours(name: str) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name, "labels": {"mine": "2"}},
        "spec": {"driver": "d", "devices": [{"name": "gpu-0"}]},
    }


SEEN: Any = freeze(
    {
        "metadata": {
            "name": "s",
            "resourceVersion": "41",
            "labels": {"mine": "1", "example.com/seen": "yes"},
            "annotations": {"woken-at": "t"},
            "finalizers": ["example.com/keep"],
        },
        "spec": {"driver": "d", "devices": []},
    }
)


def test_a_seen_slice_is_updated_from_its_copy_keeping_what_others_set() -> None:
    kube = RecordingKube()
    write_slices(kube, [ours("s")], ["old"], "m", [SEEN])  # type: ignore[arg-type]
    (verb, name, body), deleted = kube.calls
    assert (verb, name, deleted[:2]) == ("replace", "s", ("delete", "old"))
    meta = body["metadata"]
    assert meta["resourceVersion"] == "41"  # refused if anyone wrote since
    assert meta["labels"] == {"mine": "2", "example.com/seen": "yes"}
    assert meta["annotations"] == {"woken-at": "t"}
    assert meta["finalizers"] == ["example.com/keep"]
    assert body["spec"] == ours("s")["spec"]


def test_a_refused_or_vanished_update_becomes_an_apply() -> None:
    for refusal in (Conflict, NotFound):
        kube = RecordingKube(refuse=refusal)
        write_slices(kube, [ours("s")], [], "m", [SEEN])  # type: ignore[arg-type]
        assert [(v, n) for v, n, _ in kube.calls] == [("replace", "s"), ("apply", "s")]
        assert kube.calls[1][2] == ours("s")  # the apply sends only our fields


def test_an_unseen_slice_is_applied() -> None:
    kube = RecordingKube()
    write_slices(kube, [ours("new")], [], "m", [SEEN])  # type: ignore[arg-type]
    write_slices(kube, [ours("s")], [], "m")  # type: ignore[arg-type]
    assert [(v, n) for v, n, _ in kube.calls] == [("apply", "new"), ("apply", "s")]
