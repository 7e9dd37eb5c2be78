"""The plugin's gRPC endpoints over real unix sockets, as the kubelet calls them."""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from api.dra.v1 import api_pb2 as v1
from api.dra.v1 import api_pb2_grpc as v1_grpc
from api.dra.v1beta1 import api_pb2 as v1beta1
from api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from api.pluginregistration.v1 import api_pb2 as reg
from api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_driver.cdi import CdiWriter, resolve
from dra_driver.checkpoint import Checkpoint
from dra_driver.grpc_server import PluginServer
from dra_driver.prepare import Preparer
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, claim, gpu, result
from tests.unit.dra_driver.test_plugin_prepare import FakeApi


class Plugin:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.api = FakeApi()
        self.registry = tmp / "plugins_registry"
        self.plugins = tmp / "plugins"
        self.cdi_dir = tmp / "cdi"
        self.server: PluginServer | None = None
        self.channels: list[grpc.Channel] = []

    def start(self) -> PluginServer:
        preparer = Preparer(
            DRIVER,
            NODE,
            self.api,
            lambda: [gpu(i) for i in range(4)],
            Checkpoint(self.tmp / "state" / "checkpoint.json", "boot"),
            CdiWriter(self.cdi_dir, durable=False),
        )
        self.server = PluginServer(preparer, DRIVER, self.registry, self.plugins)
        self.server.start()
        return self.server

    def channel(self, path: Path) -> grpc.Channel:
        ch = grpc.insecure_channel(f"unix://{path}")
        self.channels.append(ch)
        return ch

    def v1(self) -> Any:
        assert self.server
        return v1_grpc.DRAPluginStub(self.channel(self.server.service_path))

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        if self.server:
            self.server.stop(grace=0)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Unix socket paths are limited to 107 bytes: pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="cdra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin(short_tmp: Path) -> Iterator[Plugin]:
    p = Plugin(short_tmp)
    p.start()
    yield p
    p.close()


def claim_msg(module: Any, obj: dict[str, Any]) -> Any:
    m = obj["metadata"]
    return module.Claim(namespace=m["namespace"], name=m["name"], uid=m["uid"])


def test_get_info(plugin: Plugin) -> None:
    assert plugin.server
    stub = reg_grpc.RegistrationStub(plugin.channel(plugin.registry / f"{DRIVER}-reg.sock"))
    info = stub.GetInfo(reg.InfoRequest(), timeout=5)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(plugin.plugins / DRIVER / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


def test_failed_registration_is_logged(plugin: Plugin) -> None:
    assert plugin.server
    stub = reg_grpc.RegistrationStub(plugin.channel(plugin.server.registration_path))
    with capture_logs() as captured:
        stub.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="version mismatch"), timeout=5
        )
    errors = [e for e in captured if e["log_level"] == "error"]
    assert errors and errors[0]["error"] == "version mismatch"
    assert plugin.server.registration.registered is False


def test_empty_prepare_is_ok(plugin: Plugin) -> None:
    resp = plugin.v1().NodePrepareResources(v1.NodePrepareResourcesRequest(), timeout=5)
    assert len(resp.claims) == 0


def test_prepare_answers_every_claim(plugin: Plugin) -> None:
    good = claim(name="good", results=[result("gpu-1")])
    unallocated = claim(name="unallocated", allocated=False)
    plugin.api.add(good)
    plugin.api.add(unallocated)
    req = v1.NodePrepareResourcesRequest(claims=[claim_msg(v1, good), claim_msg(v1, unallocated)])
    resp = plugin.v1().NodePrepareResources(req, timeout=5)
    assert set(resp.claims) == {good["metadata"]["uid"], unallocated["metadata"]["uid"]}
    ok = resp.claims[good["metadata"]["uid"]]
    assert ok.error == ""
    (dev,) = ok.devices
    assert (list(dev.request_names), dev.pool_name, dev.device_name) == (["gpu"], NODE, "gpu-1")
    assert all(resolve(plugin.cdi_dir, i) for i in dev.cdi_device_ids)
    assert "not allocated" in resp.claims[unallocated["metadata"]["uid"]].error

    un = plugin.v1().NodeUnprepareResources(
        v1.NodeUnprepareResourcesRequest(claims=[claim_msg(v1, good)]), timeout=5
    )
    assert un.claims[good["metadata"]["uid"]].error == ""
    assert resolve(plugin.cdi_dir, dev.cdi_device_ids[0]) is None


def test_v1beta1_service(plugin: Plugin) -> None:
    assert plugin.server
    obj = claim(results=[result("gpu-2")])
    plugin.api.add(obj)
    stub = v1beta1_grpc.DRAPluginStub(plugin.channel(plugin.server.service_path))
    resp = stub.NodePrepareResources(
        v1beta1.NodePrepareResourcesRequest(claims=[claim_msg(v1beta1, obj)]), timeout=5
    )
    (dev,) = resp.claims[obj["metadata"]["uid"]].devices
    assert dev.device_name == "gpu-2" and resolve(plugin.cdi_dir, dev.cdi_device_ids[0])
    un = stub.NodeUnprepareResources(
        v1beta1.NodeUnprepareResourcesRequest(claims=[claim_msg(v1beta1, obj)]), timeout=5
    )
    assert un.claims[obj["metadata"]["uid"]].error == ""


def test_health(plugin: Plugin) -> None:
    assert plugin.server
    stub = health_pb2_grpc.HealthStub(plugin.channel(plugin.server.service_path))
    resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_health_on_tcp_serves_once_registered_and_carries_no_dra(short_tmp: Path) -> None:
    p = Plugin(short_tmp)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    preparer = Preparer(
        DRIVER, NODE, p.api, list, Checkpoint(short_tmp / "c.json", "b"), CdiWriter(short_tmp)
    )
    server = PluginServer(preparer, DRIVER, p.registry, p.plugins, health_port=port)
    server.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        assert server.bound_health_port == port
        probe = health_pb2_grpc.HealthStub(ch)
        # The probes see the plugin serving only once the kubelet has registered it: a
        # rolling update's old instance goes only when the kubelet can call the new one.
        resp = probe.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        registrar = reg_grpc.RegistrationStub(p.channel(server.registration_path))
        registrar.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=True), timeout=5
        )
        resp = probe.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        registrar.NotifyRegistrationStatus(
            reg.RegistrationStatus(plugin_registered=False, error="refused"), timeout=5
        )
        resp = probe.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as err:
            v1_grpc.DRAPluginStub(ch).NodePrepareResources(
                v1.NodePrepareResourcesRequest(), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        ch.close()
        server.stop(grace=0)


def test_stale_sockets_replaced_and_removed_on_stop(short_tmp: Path) -> None:
    p = Plugin(short_tmp)
    reg_path = p.registry / f"{DRIVER}-reg.sock"
    svc_path = p.plugins / DRIVER / "dra.sock"
    for path in (reg_path, svc_path):
        path.parent.mkdir(parents=True)
        path.write_text("left behind by a killed plugin")
    p.start()
    try:
        info = reg_grpc.RegistrationStub(p.channel(reg_path)).GetInfo(reg.InfoRequest(), timeout=5)
        assert info.name == DRIVER
    finally:
        p.close()
    assert not reg_path.exists() and not svc_path.exists()


def test_concurrent_calls_serialized(plugin: Plugin) -> None:
    objs = [claim(name=f"c{i}", results=[result(f"gpu-{i % 4}")]) for i in range(16)]
    for o in objs:
        plugin.api.add(o)
    stub = plugin.v1()
    errors: list[str] = []

    def worker(o: dict[str, Any]) -> None:
        for _ in range(5):
            r = stub.NodePrepareResources(
                v1.NodePrepareResourcesRequest(claims=[claim_msg(v1, o)]), timeout=10
            )
            e = r.claims[o["metadata"]["uid"]].error
            if e and "already prepared" not in e:
                errors.append(e)
            stub.NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=[claim_msg(v1, o)]), timeout=10
            )

    threads = [threading.Thread(target=worker, args=(o,)) for o in objs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert list(plugin.cdi_dir.glob("*.json")) == []
