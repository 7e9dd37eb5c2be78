"""composable_dra.commands.uninstall_plan and uninstall_drain: refused while a claim holds
one of our GPUs (nothing removed), else every kind deleted in order, each gone first."""

from __future__ import annotations

from typing import Any

import pytest

from composable_dra.commands import uninstall_drain, uninstall_plan
from composable_dra.k8s.kube import JSON, Kube

DRIVER = "gpu.composable.dra.io"


def claim(name: str, driver: str | None, pods: tuple[str, ...] = ()) -> JSON:
    status: JSON = {}
    if driver:
        results = [{"driver": driver, "pool": "p", "device": "d", "request": "gpu"}]
        status["allocation"] = {"devices": {"results": results}}
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": "u"} for p in pods]
    return {"metadata": {"namespace": "ns", "name": name}, "status": status}


def test_only_claims_with_our_drivers_devices_hold_the_uninstall() -> None:
    claims = [
        claim("b", DRIVER, ("pod-b",)),
        claim("a", DRIVER),
        claim("other", "gpu.nvidia.com", ("pod-o",)),
        claim("pending", None),
    ]
    held = uninstall_plan.holders(claims, DRIVER)
    assert [str(h) for h in held] == ["ns/a (no pod yet: being allocated)", "ns/b (pods pod-b)"]
    message = uninstall_plan.refusal(held, DRIVER)
    assert message.startswith("refusing to uninstall: 2 ResourceClaim(s) hold GPUs")
    assert "ns/b (pods pod-b)" in message and "nothing was removed" in message


def test_a_long_refusal_names_ten_claims_and_counts_the_rest() -> None:
    held = uninstall_plan.holders([claim(f"c{i:02}", DRIVER) for i in range(13)], DRIVER)
    assert uninstall_plan.refusal(held, DRIVER).endswith(
        "c09 (no pod yet: being allocated); and 3 more. Delete those pods (and their "
        "claims), then run helm uninstall again; nothing was removed."
    )


class _Cluster(Kube):
    """The API as the drain reads it; a deletion is finished at once unless the object is
    ``stuck`` (its finalizer never removed)."""

    def __init__(self, objects: dict[str, list[JSON]], stuck: frozenset[str] = frozenset()):
        self.objects = objects
        self.stuck = stuck
        self.calls: list[tuple[str, str]] = []

    def get(self, url_path: str, **query: Any) -> JSON:
        return {"items": self.objects.get(url_path.rsplit("/", 1)[1], [])}

    def merge_patch(self, url_path: str, body: JSON) -> JSON:
        self.calls.append(("patch", url_path))
        return {}

    def delete(self, url_path: str, body: JSON | None = None, **query: Any) -> JSON | None:
        plural, name = url_path.rsplit("/", 2)[1:]
        self.calls.append(("delete", f"{plural}/{name}"))
        kept = []
        for o in self.objects[plural]:
            if o["metadata"]["name"] == name and name in self.stuck:
                o["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            if o["metadata"]["name"] != name or name in self.stuck:
                kept.append(o)
        self.objects[plural] = kept
        return None


def named(*names: str, **spec: Any) -> list[JSON]:
    return [{"metadata": {"name": n}, "spec": dict(spec)} for n in names]


def test_a_held_gpu_refuses_and_removes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    kube = _Cluster({"resourceclaims": [claim("a", DRIVER, ("p",))], "fabrics": named("f")})
    assert uninstall_drain.drain(kube, DRIVER, deadline=float("inf")) == uninstall_drain.REFUSED
    assert kube.calls == []
    assert "refusing to uninstall: 1 ResourceClaim(s)" in capsys.readouterr().err


def test_every_kind_is_deleted_in_order_and_the_standby_stopped_first() -> None:
    kube = _Cluster(
        {
            "resourceclaims": [claim("other", "gpu.nvidia.com", ("p",))],
            "composabilityrequests": named("r"),
            "composableresources": named("cr-1", "cr-2"),
            "fabrics": [*named("warm", standby={"minIdle": 1}), *named("cold")],
        }
    )
    assert uninstall_drain.drain(kube, DRIVER, deadline=float("inf")) == 0
    assert kube.calls == [
        ("delete", "composabilityrequests/r"),
        ("patch", "/apis/composable.dra.io/v1alpha1/fabrics/warm"),
        ("delete", "composableresources/cr-1"),
        ("delete", "composableresources/cr-2"),
        ("delete", "fabrics/cold"),
        ("delete", "fabrics/warm"),
    ]


def test_a_finalizer_never_removed_times_out_naming_what_is_left(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(uninstall_drain, "PASS_SECONDS", 0.01)
    kube = _Cluster({"composableresources": named("cr-1", "cr-2")}, stuck=frozenset({"cr-2"}))
    got = uninstall_drain.drain(kube, DRIVER, deadline=0.0)
    assert got == uninstall_drain.TIMED_OUT
    assert "composableresources not gone within the timeout: cr-2" in capsys.readouterr().err
    assert ("delete", "fabrics/f") not in kube.calls
