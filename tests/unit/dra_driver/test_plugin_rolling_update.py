"""Two plugin instances on one node during a rolling update: socket names that keep them
apart, and a checkpoint that both can change without losing or doubling a claim."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from api.pluginregistration.v1 import api_pb2 as reg
from api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_driver.cdi import CdiWriter, spec_file_name
from dra_driver.checkpoint import Checkpoint
from dra_driver.grpc_server import (
    InvalidUID,
    PluginServer,
    check_uid,
    registration_socket,
    service_socket,
)
from dra_driver.prepare import Preparer
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, claim, gpu, result
from tests.unit.dra_driver.test_plugin_prepare import FakeApi

UID_A = "0b7c2d1e-1111-4a2b-9c3d-0123456789ab"
UID_B = "5f3e9a70-2222-4c4d-8e5f-ba9876543210"


def test_socket_names_without_uid_are_the_fixed_ones() -> None:
    assert registration_socket(Path("/r"), DRIVER) == Path(f"/r/{DRIVER}-reg.sock")
    assert service_socket(Path("/p"), DRIVER) == Path(f"/p/{DRIVER}/dra.sock")


def test_socket_names_carry_the_uid_as_upstream_names_them() -> None:
    assert registration_socket(Path("/r"), DRIVER, UID_A) == Path(f"/r/{DRIVER}-{UID_A}-reg.sock")
    assert service_socket(Path("/p"), DRIVER, UID_A) == Path(f"/p/{DRIVER}/dra-{UID_A}.sock")


@pytest.mark.parametrize(
    "bad", ["../../etc/x", "a/b", "not-a-uid", UID_A + "/..", UID_A.upper() + "0", " " + UID_A]
)
def test_a_uid_that_is_no_pod_uid_is_refused(bad: str) -> None:
    with pytest.raises(InvalidUID):
        check_uid(bad)
    with pytest.raises(InvalidUID):
        registration_socket(Path("/r"), DRIVER, bad)


def test_empty_uid_means_no_rolling_update() -> None:
    assert check_uid("") == ""


def _preparer(tmp: Path, api: FakeApi) -> Preparer:
    return Preparer(
        DRIVER,
        NODE,
        api,
        lambda: [gpu(i) for i in range(2)],
        Checkpoint(tmp / "state" / "checkpoint.json", "boot"),
        CdiWriter(tmp / "cdi", durable=False),
    )


@pytest.fixture
def two_servers() -> Iterator[tuple[PluginServer, PluginServer]]:
    # Short: a unix socket path has at most 107 characters, and these carry a UID.
    tmp_path = Path(tempfile.mkdtemp(prefix="ru", dir="/tmp"))
    api = FakeApi()
    registry, plugins = tmp_path / "registry", tmp_path / "plugins"
    a = PluginServer(_preparer(tmp_path, api), DRIVER, registry, plugins, rolling_update_uid=UID_A)
    b = PluginServer(_preparer(tmp_path, api), DRIVER, registry, plugins, rolling_update_uid=UID_B)
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        a.stop(0)
        b.stop(0)
        shutil.rmtree(tmp_path, ignore_errors=True)


def _info(path: Path) -> reg.PluginInfo:
    with grpc.insecure_channel(f"unix://{path}") as ch:
        info: reg.PluginInfo = reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=10)
    return info


def test_two_instances_serve_side_by_side_and_each_removes_only_its_own(
    two_servers: tuple[PluginServer, PluginServer],
) -> None:
    a, b = two_servers
    assert _info(a.registration_path).endpoint == str(a.service_path)
    assert _info(b.registration_path).endpoint == str(b.service_path)
    assert a.service_path != b.service_path

    a.stop(0)
    assert not a.registration_path.exists() and not a.service_path.exists()
    # The new instance still serves: the old one's exit took none of its sockets.
    assert b.registration_path.exists() and b.service_path.exists()
    assert _info(b.registration_path).name == DRIVER


def test_a_second_instance_sees_what_the_first_prepared_since_it_started(
    tmp_path: Path,
) -> None:
    api = FakeApi()
    new = _preparer(tmp_path, api)  # loads the (empty) checkpoint first
    old = _preparer(tmp_path, api)
    one = api.add(claim("one", results=[result("gpu-0")]))
    assert old.prepare([one])[one.uid].error == ""

    # The same device for another claim: the new instance knows it is taken.
    two = api.add(claim("two", results=[result("gpu-0")]))
    assert "already prepared for claim" in new.prepare([two])[two.uid].error

    # The new instance unprepares what the old one prepared; the old one, writing next,
    # does not bring it back.
    assert new.unprepare([one]) == {one.uid: ""}
    three = api.add(claim("three", results=[result("gpu-1")]))
    assert old.prepare([three])[three.uid].error == ""
    on_disk = Checkpoint(tmp_path / "state" / "checkpoint.json", "boot")
    assert set(on_disk.claims) == {three.uid}
    assert not (tmp_path / "cdi" / spec_file_name(one.uid)).exists()


_HOLDER = """
import sys
from pathlib import Path
from dra_driver.checkpoint import Checkpoint
cp = Checkpoint(Path(sys.argv[1]), "boot")
with cp.exclusive():
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_the_checkpoint_lock_excludes_another_process(tmp_path: Path) -> None:
    path = tmp_path / "state" / "checkpoint.json"
    cp = Checkpoint(path, "boot")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        fd = os.open(cp.lock_path, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(30) == 0
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free once the holder let go
        finally:
            os.close(fd)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_socket_path_too_long_for_grpc_is_refused_clearly(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60)
    server = PluginServer(
        _preparer(tmp_path, FakeApi()), DRIVER, deep, deep, rolling_update_uid=UID_A
    )
    with pytest.raises(OSError, match="gRPC binds at most 105"):
        server.start()
    server.stop(0)
