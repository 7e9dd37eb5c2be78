"""The redfish-zones backend (PATCH of a system's Links.ResourceBlocks) against the emulator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from composable_dra.fabric import backend as b
from composable_dra.fabric import errors as fe
from composable_dra.fabric.redfish import RedfishCompositionBackend
from composable_dra.fabric.redfish_zones import RedfishZonesBackend, new_block_list
from fabric_emulator.testing import EmulatorProcess
from testbed.wait import wait_for

BLOCK = "/redfish/v1/CompositionService/ResourceBlocks"


@pytest.fixture
def zones(emu: EmulatorProcess) -> Iterator[RedfishZonesBackend]:
    emu.reset()
    backend = RedfishZonesBackend(emu.url, "admin", "admin")
    yield backend
    backend.close()


def finish(fabric: b.FabricBackend, op: b.Operation | None) -> None:
    if op is None:
        return
    wait_for(lambda: fabric.operation_status(op).state == "done", 20, "the task to end")


def test_new_block_list() -> None:
    system = f"{BLOCK}/system-node-1"
    assert new_block_list([system], "gpu-1", add=True) == [system, f"{BLOCK}/gpu-1"]
    assert new_block_list([system, f"{BLOCK}/gpu-1"], "gpu-1", add=True) is None
    assert new_block_list([system, f"{BLOCK}/gpu-1"], "gpu-1", add=False) == [system]
    assert new_block_list([system], "gpu-1", add=False) is None


def test_attach_and_detach_by_patch(zones: RedfishZonesBackend) -> None:
    finish(zones, zones.attach("gpu-1", "node-1"))
    device = zones.device("gpu-1")
    assert device is not None and (device.state, device.host) == ("attached", "node-1")
    assert zones.attach("gpu-1", "node-1") is None  # already attached: nothing to change
    with pytest.raises(fe.InUseError):
        zones.attach("gpu-1", "node-2")
    finish(zones, zones.detach("gpu-1", "node-1"))
    assert zones.inventory().devices["gpu-1"].state == "free"


def test_a_change_in_between_is_refused_not_overwritten(
    zones: RedfishZonesBackend, emu: EmulatorProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu.configure(async_polls=0)
    other = RedfishCompositionBackend(emu.url, "admin", "admin")
    real = zones._call
    raced: list[str] = []

    def racing(method: str, uri: str, *args: Any) -> tuple[int, Any, dict[str, str]]:
        if method == "PATCH" and not raced:
            raced.append(uri)  # another writer changes the system after our GET
            assert other.attach("gpu-2", "node-1") is None
        return real(method, uri, *args)

    monkeypatch.setattr(zones, "_call", racing)
    with pytest.raises(fe.BusyError):
        zones.attach("gpu-1", "node-1")
    inv = zones.inventory()
    assert inv.devices["gpu-1"].state == "free"  # ours was not applied
    assert inv.devices["gpu-2"].host == "node-1"  # and the other writer's was not undone
    finish(zones, zones.attach("gpu-1", "node-1"))  # decided again, it goes through
    both = zones.inventory()
    assert {both.devices["gpu-1"].host, both.devices["gpu-2"].host} == {"node-1"}
    other.close()


def test_a_device_id_cannot_name_another_resource(
    zones: RedfishZonesBackend, emu: EmulatorProcess
) -> None:
    for device_id in ("../../../Systems/node-1", "gpu-1?x", ".."):
        with pytest.raises(fe.FabricError, match="invalid device id"):
            zones.attach(device_id, "node-1")
        with pytest.raises(fe.FabricError, match="invalid device id"):
            new_block_list([], device_id, add=True)
    assert emu.state()["systems"]["node-1"]["blocks"] == []
