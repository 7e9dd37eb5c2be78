"""The nvml source: the NVIDIA GPUs the driver on this host sees (nvidia-ml-py)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from composable_dra.model.health import HealthReport
from dra_driver.device_source import DeviceInfo, ProcessesUnknown, device_name_for

if TYPE_CHECKING:
    from dra_driver.sources.nvml_health import NvmlHealth

# Device nodes every container using an NVIDIA GPU needs, besides its own /dev/nvidiaN.
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def nvml_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    name = "nvml"

    def __init__(self, nvml: Any = None, poll_interval: float = 5.0) -> None:
        """``nvml`` is the pynvml module; tests hand in a fake one."""
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self.poll_interval = poll_interval
        self._lock = threading.Lock()
        self._initialised = False
        self._health: NvmlHealth | None = None  # made at the first reports()

    def _init(self) -> None:  # under the lock
        if not self._initialised:
            self._nvml.nvmlInit()
            self._initialised = True

    def list_devices(self) -> list[DeviceInfo]:
        nv = self._nvml
        with self._lock:
            self._init()
            devices = []
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml_text(nv.nvmlDeviceGetUUID(handle))
                product = nvml_text(nv.nvmlDeviceGetName(handle))
                minor = int(nv.nvmlDeviceGetMinorNumber(handle))
                memory = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
                try:
                    bus_id: str | None = nvml_text(nv.nvmlDeviceGetPciInfo(handle).busId)
                except nv.NVMLError:
                    bus_id = None
                devices.append(
                    DeviceInfo(
                        name=device_name_for(uuid),
                        uuid=uuid,
                        product_name=product,
                        model=product.removeprefix("NVIDIA ").split()[0] if product else "",
                        attachment="local",
                        pci_bus_id=bus_id.lower() if bus_id else None,
                        memory_bytes=memory,
                        device_nodes=(f"/dev/nvidia{minor}", *CONTROL_NODES),
                    )
                )
            return devices

    def reports(self) -> Iterable[HealthReport]:
        """The GPUs' health (nvml_health.NvmlHealth on the same NVML): with this, the
        plugin's health board takes the device source as a health source as well."""
        if self._health is None:
            from dra_driver.sources.nvml_health import NvmlHealth

            self._health = NvmlHealth(self._nvml)
        return self._health.reports()

    def processes(self, uuid: str) -> list[int]:
        """The pids of the processes using the GPU (compute and graphics); raises
        ProcessesUnknown when the driver does not answer."""
        nv = self._nvml
        with self._lock:
            self._init()
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
                found = list(nv.nvmlDeviceGetComputeRunningProcesses(handle))
                graphics = getattr(nv, "nvmlDeviceGetGraphicsRunningProcesses", None)
                if graphics is not None:
                    found += list(graphics(handle))
            except nv.NVMLError as exc:
                raise ProcessesUnknown(str(exc)) from exc
            return sorted({int(p.pid) for p in found})

    def pcie_bytes_per_second(self) -> float | None:
        """The PCIe traffic of every GPU on this host, both ways (NVML samples each over
        20 ms, in KB/s); None when this driver cannot measure it."""
        nv = self._nvml
        with self._lock:
            self._init()
            total = 0.0
            try:
                for index in range(nv.nvmlDeviceGetCount()):
                    handle = nv.nvmlDeviceGetHandleByIndex(index)
                    for counter in (nv.NVML_PCIE_UTIL_TX_BYTES, nv.NVML_PCIE_UTIL_RX_BYTES):
                        total += float(nv.nvmlDeviceGetPcieThroughput(handle, counter)) * 1024
            except nv.NVMLError:
                return None
            return total

    def close(self) -> None:
        if self._health is not None:
            self._health.close()
        with self._lock:
            if self._initialised:
                self._nvml.nvmlShutdown()
                self._initialised = False
