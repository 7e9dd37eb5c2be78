"""The emulated hosts' PCIe side, in a directory shared with the hosts (``--host-state-dir``).

A real host holds a GPU the fabric attached until its OS removes the PCIe function; a
removal by the fabric while the host still holds it (the driver bound, a process using
the GPU) is a surprise removal, which can hang the host. The emulator cannot see into a
host, so each emulated host keeps its GPUs here, one JSON file per GPU under a directory
per host (``<dir>/<host>/<uuid>.json``): the emulator writes one when it attaches the
block and removes it when it detaches the block; the host's side (the test's fake NVML,
``testbed/fake_nvml``, and its release command) writes the processes using the GPU and
whether the OS released it. None of it is written by the kubelet plugin under test, so a
plugin that skips its release is caught here, not believed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class HostGpu:
    """One GPU as its host sees it."""

    uuid: str  # "GPU-<uuid>", as NVML says it
    block: str
    product_name: str
    memory_mib: int
    minor: int
    pci_bus_id: str
    processes: tuple[int, ...] = ()  # pids using it (NVML's process table)
    released: bool = False  # the OS removed its PCIe function (the release command ran)
    xids: tuple[int, ...] = ()  # XID events not yet delivered to an NVML event set
    ecc_uncorrected_volatile: int = 0
    lost: bool = False  # NVML answers NVML_ERROR_GPU_IS_LOST for it


def pci_bus_id(block: str) -> str:
    """A stable PCI address for a block (the bus number from its id)."""
    bus = hashlib.sha256(block.encode()).digest()[0]
    return f"00000000:{bus:02x}:00.0"


def _file(root: Path, host: str, uuid: str) -> Path:
    return root / host / f"{uuid}.json"


@contextlib.contextmanager
def _locked(root: Path, host: str) -> Iterator[Path]:
    """The host's directory, locked against the other writers (emulator, test, command)."""
    directory = root / host
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield directory
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: Path) -> HostGpu | None:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    raw["processes"] = tuple(raw.get("processes") or ())
    raw["xids"] = tuple(raw.get("xids") or ())
    return HostGpu(**raw)


def _write(path: Path, gpu: HostGpu) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(gpu)), encoding="utf-8")
    os.replace(tmp, path)


def gpus(root: Path, host: str) -> list[HostGpu]:
    """The GPUs the fabric attached to the host, by minor number (released ones too)."""
    directory = root / host
    if not directory.is_dir():
        return []
    found = [g for p in directory.glob("*.json") if (g := _read(p)) is not None]
    return sorted(found, key=lambda g: g.minor)


def attach(root: Path, host: str, block: str, uuid: str, model: str, memory_mib: int) -> None:
    """The fabric attached the block: the host sees a new GPU (as after a PCI rescan)."""
    with _locked(root, host):
        taken = {g.minor for g in gpus(root, host)}
        minor = next(i for i in range(len(taken) + 1) if i not in taken)
        name = model if model.startswith("NVIDIA") else f"NVIDIA {model}"
        gpu = HostGpu(uuid, block, name, memory_mib, minor, pci_bus_id(block))
        _write(_file(root, host, uuid), gpu)


def update(root: Path, host: str, uuid: str, change: Callable[[HostGpu], HostGpu]) -> HostGpu:
    """Change one GPU's host-side state; KeyError if the host does not have it."""
    with _locked(root, host):
        path = _file(root, host, uuid)
        gpu = _read(path)
        if gpu is None:
            raise KeyError(f"host {host} has no GPU {uuid}")
        gpu = change(gpu)
        _write(path, gpu)
        return gpu


def set_processes(root: Path, host: str, uuid: str, pids: tuple[int, ...]) -> HostGpu:
    return update(root, host, uuid, lambda g: replace(g, processes=pids))


def release(root: Path, host: str, uuid: str) -> HostGpu:
    """The host's OS removed the GPU's PCIe function (a release command's effect)."""
    return update(root, host, uuid, lambda g: replace(g, released=True))


def held_because(gpu: HostGpu) -> str | None:
    """Why removing this GPU now would be a surprise to its host; None if it would not."""
    if gpu.processes:
        return f"processes {', '.join(map(str, gpu.processes))} use it"
    if not gpu.released:
        return "the host has not released it"
    return None


def detach(root: Path, host: str, uuid: str) -> str | None:
    """The fabric removed the block: the host loses the GPU. Returns why that was a
    surprise to the host (None: it had let go, or never knew the GPU)."""
    with _locked(root, host):
        path = _file(root, host, uuid)
        gpu = _read(path)
        path.unlink(missing_ok=True)
    return held_because(gpu) if gpu is not None else None
