"""Fabrics: the Fabric and its Secrets are read at most every max_age seconds."""

from __future__ import annotations

import base64
import tempfile
import threading
import time
from typing import Any

import pytest

from composable_dra.fabric.registry import FabricGoneError, Fabrics
from composable_dra.k8s.kube import NotFound


class CountingKube:
    """Answers GETs of one Fabric and its credentials Secret, counting them."""

    def __init__(self) -> None:
        self.gets: list[str] = []
        self.fabric: dict[str, Any] | None = {
            "metadata": {"name": "fab", "resourceVersion": "1"},
            "spec": {
                "backend": "redfish-composition",
                "endpoint": "https://fabric.example:8443",
                "credentialsSecret": {"namespace": "ns", "name": "creds"},
            },
        }
        self.secret = {
            "metadata": {"namespace": "ns", "name": "creds", "resourceVersion": "7"},
            "data": {
                "username": base64.b64encode(b"u").decode(),
                "password": base64.b64encode(b"p").decode(),
            },
        }

    def get_or_none(self, url: str) -> dict[str, Any] | None:
        self.gets.append(url)
        return self.fabric

    def get(self, url: str) -> dict[str, Any]:
        self.gets.append(url)
        if url.endswith("/secrets/creds"):
            return self.secret
        raise NotFound(404, "NotFound", url)


class Backend:
    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def test_reads_are_reused_within_max_age_and_changes_seen_after(clock: list[float]) -> None:
    kube = CountingKube()
    built: list[Backend] = []

    def factory(*_: Any) -> Backend:
        built.append(Backend())
        return built[-1]

    fabrics = Fabrics(kube, {"redfish-composition": factory}, max_age=1.0)  # type: ignore[arg-type,dict-item]
    first = fabrics.get("fab")
    assert len(kube.gets) == 2  # the Fabric and its Secret
    clock[0] += 0.5
    assert fabrics.get("fab")[1] is first[1]
    assert len(kube.gets) == 2  # within max_age: nothing read
    kube.secret["metadata"]["resourceVersion"] = "8"  # rotated credentials
    clock[0] += 0.6
    second = fabrics.get("fab")
    assert len(kube.gets) == 4
    assert second[1] is not first[1] and built[0].closed  # rebuilt, the old one closed
    kube.fabric = None  # the Fabric is deleted
    clock[0] += 1.1
    with pytest.raises(FabricGoneError):
        fabrics.get("fab")


def test_a_status_write_keeps_the_backend_and_a_spec_change_rebuilds_it(
    clock: list[float],
) -> None:
    kube = CountingKube()
    assert kube.fabric is not None
    kube.fabric["metadata"]["generation"] = 1
    built: list[Backend] = []

    def factory(*_: Any) -> Backend:
        built.append(Backend())
        return built[-1]

    fabrics = Fabrics(kube, {"redfish-composition": factory}, max_age=1.0)  # type: ignore[arg-type,dict-item]
    first = fabrics.get("fab")[1]
    # The operator writes the Fabric's status each poll: a new resourceVersion only.
    kube.fabric["metadata"]["resourceVersion"] = "2"
    clock[0] += 1.1
    assert fabrics.get("fab")[1] is first and len(built) == 1 and not built[0].closed
    kube.fabric["metadata"].update(resourceVersion="3", generation=2)
    clock[0] += 1.1
    assert fabrics.get("fab")[1] is not first and built[0].closed


def test_backends_get_the_connection_count_they_are_built_with() -> None:
    seen: list[int] = []

    def factory(*args: Any) -> Backend:
        seen.append(args[3])
        return Backend()

    Fabrics(CountingKube(), {"redfish-composition": factory}, connections=64).get("fab")  # type: ignore[arg-type,dict-item]
    assert seen == [64]


class SlowKube(CountingKube):
    """Each read takes a while: concurrent callers overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def get_or_none(self, url: str) -> dict[str, Any] | None:
        with self.lock:
            self.gets.append(url)
        time.sleep(0.2)  # the API server's answer takes that long
        return self.fabric


def test_callers_that_find_the_cache_old_share_one_read() -> None:
    kube = SlowKube()
    fabrics = Fabrics(kube, {"redfish-composition": lambda *_: Backend()}, max_age=60)  # type: ignore[arg-type,dict-item]
    got: list[object] = []
    callers = [threading.Thread(target=lambda: got.append(fabrics.get("fab")[1])) for _ in range(8)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(10)
    assert len(got) == 8 and len({id(b) for b in got}) == 1
    assert len(kube.gets) == 2  # one Fabric read and one Secret read, not eight of each


def test_the_ca_file_lives_only_as_long_as_the_registry(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registry makes no directory until a Fabric has a CA, and close() removes it: the
    operator and publisher make one registry each, but tests make hundreds."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kube = CountingKube()
    fabrics = Fabrics(kube, {"redfish-composition": lambda *_: Backend()})  # type: ignore[arg-type,dict-item]
    fabrics.get("fab")
    assert list(tmp_path.iterdir()) == []  # no CA, no directory

    assert kube.fabric is not None
    kube.fabric["spec"]["caSecret"] = {"namespace": "ns", "name": "ca"}
    kube.fabric["metadata"]["resourceVersion"] = "2"
    ca = {
        "metadata": {"namespace": "ns", "name": "ca", "resourceVersion": "3"},
        "data": {"ca.crt": base64.b64encode(b"PEM").decode()},
    }
    real_get = kube.get
    kube.get = lambda url: ca if url.endswith("/secrets/ca") else real_get(url)  # type: ignore[method-assign]
    fabrics.max_age = 0
    fabrics.get("fab")
    (made,) = tmp_path.iterdir()
    assert (made / "fab.crt").read_text() == "PEM"

    fabrics.close()
    assert list(tmp_path.iterdir()) == []
