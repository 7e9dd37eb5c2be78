"""The emulator counts a block removed while its host still holds it (host_bus.py): the
host's side (processes, the release) is written by the host, never by the kubelet plugin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric_emulator import host_bus
from fabric_emulator.testing import EmulatorProcess
from tests.unit.fabric_emulator.conftest import Client


@pytest.fixture
def tracked(tmp_path: Path) -> Iterator[tuple[EmulatorProcess, Client, Path]]:
    hosts = tmp_path / "hosts"
    with EmulatorProcess(host_state_dir=hosts, workdir=tmp_path / "emu") as emu:
        yield emu, Client(emu.url), hosts


def _uuid(emu: EmulatorProcess, block: str) -> str:
    uuid: str = emu.state()["blocks"][block]["uuid"]
    return uuid


def test_attach_shows_the_gpu_on_its_host(tracked: tuple[EmulatorProcess, Client, Path]) -> None:
    emu, client, hosts = tracked
    assert client.attach("node-1", "gpu-1").status_code in (200, 204)
    [gpu] = host_bus.gpus(hosts, "node-1")
    assert (gpu.block, gpu.uuid, gpu.released, gpu.processes) == (
        "gpu-1",
        _uuid(emu, "gpu-1"),
        False,
        (),
    )


def test_a_removal_the_host_released_is_no_surprise(
    tracked: tuple[EmulatorProcess, Client, Path],
) -> None:
    emu, client, hosts = tracked
    client.attach("node-1", "gpu-1")
    host_bus.release(hosts, "node-1", _uuid(emu, "gpu-1"))
    assert client.detach("node-1", "gpu-1").status_code in (200, 204)
    assert emu.surprise_removals() == []
    assert host_bus.gpus(hosts, "node-1") == []


def test_a_removal_without_the_release_is_a_surprise(
    tracked: tuple[EmulatorProcess, Client, Path],
) -> None:
    emu, client, _ = tracked
    client.attach("node-1", "gpu-1")
    client.detach("node-1", "gpu-1")
    [s] = emu.surprise_removals()
    assert (s["block"], s["system"]) == ("gpu-1", "node-1")
    assert "not released" in s["why"]
    assert "surprise removal" in emu.log_tail()


def test_a_removal_while_a_process_holds_it_is_a_surprise_even_if_released(
    tracked: tuple[EmulatorProcess, Client, Path],
) -> None:
    emu, client, hosts = tracked
    client.attach("node-1", "gpu-1")
    uuid = _uuid(emu, "gpu-1")
    host_bus.release(hosts, "node-1", uuid)
    host_bus.set_processes(hosts, "node-1", uuid, (4242,))
    client.detach("node-1", "gpu-1")
    [s] = emu.surprise_removals()
    assert "4242" in s["why"]
    emu.reset()
    assert len(emu.surprise_removals()) == 1  # a reset does not hide one


def test_untracked_emulators_count_nothing(emulator: EmulatorProcess) -> None:
    client = Client(emulator.url)
    client.attach("node-2", "gpu-2")
    client.detach("node-2", "gpu-2")
    assert emulator.surprise_removals() == []


def test_held_because_reads_only_the_hosts_side() -> None:
    gpu = host_bus.HostGpu("GPU-1", "b", "NVIDIA H100", 1, 0, "0000:01:00.0")
    assert host_bus.held_because(gpu) == "the host has not released it"
    assert host_bus.held_because(host_bus.HostGpu(**{**gpu.__dict__, "released": True})) is None
