"""A fake ``pynvml`` (nvidia-ml-py) over the emulated host's state (fabric_emulator/host_bus.py).

The subset the plugin calls: devices, their processes, XID events (an event set delivers
each XID written to a GPU's file once), volatile ECC counters, and a lost GPU (every call
about it answers NVML_ERROR_GPU_IS_LOST, as the driver does once a GPU fell off the bus).
A GPU the host released (its PCIe function removed) is no longer listed.
"""

from __future__ import annotations

import os
from collections import namedtuple
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fabric_emulator import host_bus
from testbed.fake_nvml import HOST_ENV, ROOT_ENV

NVML_SUCCESS = 0
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


# The shapes of pynvml's answers the plugin reads (field names are pynvml's).
Handle = namedtuple("Handle", ["uuid"])
Memory = namedtuple("Memory", ["total", "free", "used"], defaults=[0])
PciInfo = namedtuple("PciInfo", ["busId"])
Process = namedtuple("Process", ["pid", "usedGpuMemory"], defaults=[0])
EventData = namedtuple("EventData", ["device", "eventType", "eventData"])


@dataclass
class EventSet:
    devices: dict[str, int] = field(default_factory=dict)  # uuid -> event mask


def _where() -> tuple[Path, str]:
    return Path(os.environ[ROOT_ENV]), os.environ[HOST_ENV]


def _listed() -> list[host_bus.HostGpu]:
    root, host = _where()
    return [g for g in host_bus.gpus(root, host) if not g.released]


def _gpu(handle: Handle) -> host_bus.HostGpu:
    for g in _listed():
        if g.uuid == handle.uuid:
            if g.lost:
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            return g
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlInit() -> None:
    _where()


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return len(_listed())


def nvmlDeviceGetHandleByIndex(index: int) -> Handle:
    listed = _listed()
    if not 0 <= index < len(listed):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return Handle(listed[index].uuid)


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> Handle:
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    handle = Handle(text)
    _gpu(handle)
    return handle


def nvmlDeviceGetUUID(handle: Handle) -> str:
    return str(handle.uuid)  # known even of a lost GPU: the handle carries it


def nvmlDeviceGetName(handle: Handle) -> str:
    return _gpu(handle).product_name


def nvmlDeviceGetMinorNumber(handle: Handle) -> int:
    return _gpu(handle).minor


def nvmlDeviceGetMemoryInfo(handle: Handle) -> Memory:
    total = _gpu(handle).memory_mib * 1024 * 1024
    return Memory(total=total, free=total)


def nvmlDeviceGetPciInfo(handle: Handle) -> PciInfo:
    return PciInfo(_gpu(handle).pci_bus_id)


def nvmlDeviceGetPcieThroughput(handle: Handle, counter: int) -> int:
    _gpu(handle)
    return 0


def nvmlDeviceGetComputeRunningProcesses(handle: Handle) -> list[Process]:
    return [Process(pid) for pid in _gpu(handle).processes]


def nvmlDeviceGetTotalEccErrors(handle: Handle, error_type: int, counter_type: int) -> int:
    gpu = _gpu(handle)
    if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED and counter_type == NVML_VOLATILE_ECC:
        return gpu.ecc_uncorrected_volatile
    return 0


def nvmlEventSetCreate() -> EventSet:
    return EventSet()


def nvmlDeviceRegisterEvents(handle: Handle, mask: int, event_set: EventSet) -> None:
    _gpu(handle)
    event_set.devices[handle.uuid] = mask


def nvmlEventSetWait(event_set: EventSet, timeout_ms: int) -> EventData:
    """The next XID of a registered GPU; NVML_ERROR_TIMEOUT at once when there is none
    (the fake does not block: a caller waits between its polls anyway)."""
    root, host = _where()
    for gpu in host_bus.gpus(root, host):
        mask = event_set.devices.get(gpu.uuid, 0)
        if gpu.xids and mask & nvmlEventTypeXidCriticalError:
            host_bus.update(root, host, gpu.uuid, lambda g: replace(g, xids=g.xids[1:]))
            return EventData(Handle(gpu.uuid), nvmlEventTypeXidCriticalError, gpu.xids[0])
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetFree(event_set: EventSet) -> None:
    event_set.devices.clear()


def __getattr__(name: str) -> Any:
    raise AttributeError(f"the fake NVML has no {name}")
