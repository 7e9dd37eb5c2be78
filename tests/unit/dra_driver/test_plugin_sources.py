"""Device sources: static file, fake NVML, a small fake Redfish service; the watcher."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError
from redfish.rest.v1 import RetriesExhaustedError

from dra_driver import plugin_main
from dra_driver.device_source import DeviceInfo, SourceWatcher, device_name_for, is_dns_label
from dra_driver.sources.nvml import NvmlSource
from dra_driver.sources.redfish import (
    RedfishCredentials,
    RedfishError,
    RedfishSource,
    gpu_from_processor,
    load_credentials,
)
from dra_driver.sources.static import StaticSource, parse_static
from testbed.pki import CertificateAuthority


def test_device_names_are_dns_labels() -> None:
    for uuid in ("GPU-8f3e1a2b-0000-1111-2222-333344445555", "ABC_def.1", "gpu-x", "--"):
        assert is_dns_label(device_name_for(uuid)), uuid
    assert device_name_for("GPU-AbC") == "gpu-abc"
    with pytest.raises(ValidationError):
        DeviceInfo(name="Not_A_Label", uuid="u")


STATIC = """
devices:
  - uuid: GPU-1111
    productName: NVIDIA H100 80GB HBM3
    model: H100
    pciBusID: "0000:3b:00.0"
    memory: 80Gi
  - uuid: GPU-2222
    name: second
    attachment: fabric
    memory: 1073741824
"""


def test_static_parse() -> None:
    a, b = parse_static(STATIC)
    assert a.name == "gpu-1111" and a.memory_bytes == 80 * 2**30 and a.pci_bus_id
    assert b.name == "second" and b.attachment == "fabric" and b.memory_bytes == 2**30
    with pytest.raises(ValidationError):
        parse_static("devices: [{uuid: X, colour: red}]")


def test_static_reload_on_change(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    src = StaticSource(path)
    assert src.list_devices() == []  # missing file: no devices yet
    path.write_text(STATIC)
    assert [d.uuid for d in src.list_devices()] == ["GPU-1111", "GPU-2222"]
    path.write_text("devices: [{uuid: GPU-3333}]\n")
    os.utime(path, ns=(1, 1))  # a different stamp even within one mtime tick
    assert [d.uuid for d in src.list_devices()] == ["GPU-3333"]


def test_watcher_reports_changes_and_keeps_last_good_list(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(STATIC)
    seen: list[list[str]] = []
    watcher = SourceWatcher(StaticSource(path), lambda ds: seen.append([d.name for d in ds]))
    assert watcher.poll_once() is True
    assert watcher.poll_once() is False  # unchanged: no callback
    path.write_text("devices: [{uuid: [not, a, string]}]\n")
    os.utime(path, ns=(2, 2))
    assert watcher.poll_once() is False  # a broken file keeps the last good list
    assert [d.name for d in watcher.devices] == ["gpu-1111", "second"]
    path.write_text("devices: []\n")
    os.utime(path, ns=(3, 3))
    assert watcher.poll_once() is True
    assert seen == [["gpu-1111", "second"], []]


class FakeNvml:
    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        self.gpus = [
            {
                "uuid": b"GPU-aaaa",
                "name": b"NVIDIA A100-SXM4-80GB",
                "minor": 0,
                "mem": 80 * 2**30,
                "bus": "00000000:3B:00.0",
            },
            {
                "uuid": "GPU-bbbb",
                "name": "NVIDIA H100 80GB HBM3",
                "minor": 3,
                "mem": 80 * 2**30,
                "bus": None,
            },
        ]
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: dict[str, Any]) -> Any:
        return h["uuid"]

    def nvmlDeviceGetName(self, h: dict[str, Any]) -> Any:
        return h["name"]

    def nvmlDeviceGetMinorNumber(self, h: dict[str, Any]) -> int:
        return int(h["minor"])

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> Any:
        return SimpleNamespace(total=h["mem"], free=0, used=0)

    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> Any:
        if h["bus"] is None:
            raise self.NVMLError("not supported")
        return SimpleNamespace(busId=h["bus"])


def test_nvml_source() -> None:
    fake = FakeNvml()
    src = NvmlSource(nvml=fake)
    a, b = src.list_devices()
    assert (a.name, a.uuid, a.product_name, a.model) == (
        "gpu-aaaa",
        "GPU-aaaa",
        "NVIDIA A100-SXM4-80GB",
        "A100-SXM4-80GB",
    )
    assert a.pci_bus_id == "00000000:3b:00.0" and a.memory_bytes == 80 * 2**30
    assert a.device_nodes[0] == "/dev/nvidia0" and "/dev/nvidiactl" in a.device_nodes
    assert b.device_nodes[0] == "/dev/nvidia3" and b.pci_bus_id is None
    fake.gpus.pop()
    assert [d.uuid for d in src.list_devices()] == ["GPU-aaaa"]
    assert fake.inits == 1
    src.close()
    assert fake.shutdowns == 1


# -- redfish -----------------------------------------------------------------------------

SYSTEM_UUID = "4C4C4544-0042-3510-8057-B3C04F4E3332"


def processor(pid: str, ptype: str, uuid: str | None, **extra: Any) -> dict[str, Any]:
    body = {
        "@odata.id": f"/redfish/v1/Systems/host-b/Processors/{pid}",
        "Id": pid,
        "ProcessorType": ptype,
        "Model": "A100",
        "Manufacturer": "NVIDIA",
        **extra,
    }
    if uuid:
        body["UUID"] = uuid
    return body


class FakeRedfish:
    """Just the resources the source reads, served by aiohttp on a thread."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.processors: dict[str, dict[str, Any]] = {
            "cpu0": processor("cpu0", "CPU", "cpu-uuid"),
            "gpu0": processor(
                "gpu0", "GPU", "GPU-1111", MemorySummary={"TotalMemorySizeMiB": 81920}
            ),
            "gpu1": processor(
                "gpu1",
                "GPU",
                "GPU-2222",
                ProcessorMemory=[{"CapacityMiB": 40960}, {"CapacityMiB": 40960}],
            ),
        }
        self.auth_headers: list[tuple[str, str | None]] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _resources(self) -> dict[str, dict[str, Any]]:
        systems = {
            "/redfish/v1/Systems/host-a": {
                "Id": "host-a",
                "UUID": "00000000-0000-0000-0000-0000000000aa",
                "Processors": {"@odata.id": "/redfish/v1/Systems/host-a/Processors"},
            },
            "/redfish/v1/Systems/host-b": {
                "Id": "host-b",
                "UUID": SYSTEM_UUID.lower(),
                "Processors": {"@odata.id": "/redfish/v1/Systems/host-b/Processors"},
            },
        }
        out: dict[str, dict[str, Any]] = {
            "/redfish/v1": {"Systems": {"@odata.id": "/redfish/v1/Systems"}},
            "/redfish/v1/Systems": {"Members": [{"@odata.id": k} for k in systems]},
            "/redfish/v1/Systems/host-a/Processors": {"Members": []},
            "/redfish/v1/Systems/host-b/Processors": {
                "Members": [{"@odata.id": p["@odata.id"]} for p in self.processors.values()]
            },
            **systems,
        }
        for p in self.processors.values():
            out[p["@odata.id"]] = p
        return out

    async def _handle(self, request: web.Request) -> web.Response:
        self.auth_headers.append((request.path, request.headers.get("Authorization")))
        body = self._resources().get(request.path.rstrip("/"))
        if body is None:
            return web.json_response({"error": "not found"}, status=404)
        return web.json_response(body)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        # No access log: a request answered as its test ends logged to a closed capture.
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.tls)
        self._loop.run_until_complete(site.start())
        self._ready.set()
        self._loop.run_forever()

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def fabric() -> Iterator[FakeRedfish]:
    f = FakeRedfish()
    f.start()
    yield f
    f.stop()


def test_redfish_source_lists_gpus_of_this_host(fabric: FakeRedfish) -> None:
    src = RedfishSource(
        f"http://127.0.0.1:{fabric.port}",
        SYSTEM_UUID,  # upper case: matched case-insensitively
        credentials=RedfishCredentials("admin", "s3cret"),
    )
    devices = src.list_devices()
    assert [(d.uuid, d.memory_bytes, d.attachment) for d in devices] == [
        ("GPU-1111", 80 * 2**30, "fabric"),
        ("GPU-2222", 80 * 2**30, "fabric"),
    ]
    assert devices[0].product_name == "NVIDIA A100" and devices[0].model == "A100"
    # The service root is public; everything under it is read with credentials.
    reads = [h for path, h in fabric.auth_headers if path.startswith("/redfish/v1/Systems")]
    assert reads and all(h and h.startswith("Basic ") for h in reads)
    # Hot detach and attach show on the next read.
    del fabric.processors["gpu0"]
    fabric.processors["gpu7"] = processor("gpu7", "GPU", "GPU-7777")
    assert [d.uuid for d in src.list_devices()] == ["GPU-2222", "GPU-7777"]
    src.close()


@pytest.fixture
def tls_fabric(tmp_path: Path) -> Iterator[tuple[FakeRedfish, Path]]:
    """The fake behind TLS, its certificate signed by a CA no system bundle holds."""
    ca = CertificateAuthority(tmp_path / "pki")
    pair = ca.issue("fabric", "fabric", ips=("127.0.0.1",), server=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pair.cert, pair.key)
    f = FakeRedfish(tls)
    f.start()
    yield f, ca.cert_path
    f.stop()


def test_the_plugins_redfish_source_verifies_tls_with_its_ca_file(
    tls_fabric: tuple[FakeRedfish, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--redfish-ca-file reaches the source; without it the system bundle is used, and a
    manager that no CA there signed is not trusted (the DMTF client would not check)."""
    fabric, ca = tls_fabric
    monkeypatch.delenv("REDFISH_USERNAME", raising=False)
    node = {"status": {"nodeInfo": {"systemUUID": SYSTEM_UUID}}}

    def source(ca_file: Path | None) -> Any:
        return plugin_main._make_source(
            argparse.Namespace(
                poll_interval=None,
                device_source="redfish",
                redfish_endpoint=f"https://127.0.0.1:{fabric.port}",
                redfish_credentials_file=None,
                redfish_ca_file=ca_file,
                node_name="node-b",
            ),
            node,
        )

    assert [d.uuid for d in source(ca).list_devices()] == ["GPU-1111", "GPU-2222"]
    with pytest.raises(RetriesExhaustedError) as untrusted:
        source(None).list_devices()
    assert "CERTIFICATE_VERIFY_FAILED" in repr(untrusted.value.__cause__)


def test_redfish_unknown_host(fabric: FakeRedfish) -> None:
    src = RedfishSource(f"http://127.0.0.1:{fabric.port}", "no-such-uuid")
    with pytest.raises(RedfishError, match="no ComputerSystem"):
        src.list_devices()


def test_processor_mapping() -> None:
    assert gpu_from_processor(processor("c", "CPU", "x")) is None
    assert gpu_from_processor(processor("g", "GPU", None)) is None
    absent = processor("g", "GPU", "u", Status={"State": "Absent"})
    assert gpu_from_processor(absent) is None


def test_credentials_from_file_or_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "creds.yaml"
    path.write_text("username: admin\npassword: hunter2\n")
    creds = load_credentials(path)
    assert creds == RedfishCredentials("admin", "hunter2")
    assert "hunter2" not in repr(creds)
    monkeypatch.setenv("REDFISH_USERNAME", "u")
    monkeypatch.setenv("REDFISH_PASSWORD", "p")
    assert load_credentials(None) == RedfishCredentials("u", "p")
    path.write_text("username: only\n")
    with pytest.raises(RedfishError):
        load_credentials(path)


def test_redfish_source_reports_its_gpus_fabric_status(fabric: FakeRedfish) -> None:
    from composable_dra.model.health import Health, Reason

    src = RedfishSource(f"http://127.0.0.1:{fabric.port}", SYSTEM_UUID)
    assert src.reports() == []  # nothing read yet: nothing judged
    fabric.processors["gpu0"]["Status"] = {"State": "Enabled", "Health": "Critical"}
    fabric.processors["gpu1"]["Status"] = {"State": "Absent", "Health": "OK"}
    names = [d.name for d in src.list_devices()]
    by_device = {r.device: r for r in src.reports()}
    assert by_device[names[0]].reason is Reason.FABRIC_CRITICAL
    # The Absent GPU leaves the device list but is still reported, as gone.
    assert len(names) == 1
    (absent,) = [r for d, r in by_device.items() if d != names[0]]
    assert absent.reason is Reason.FABRIC_ABSENT and absent.fatal
    fabric.processors["gpu0"]["Status"] = {"State": "Enabled", "Health": "OK"}
    src.list_devices()
    assert {r.device: r.health for r in src.reports()}[names[0]] is Health.HEALTHY
    src.close()
