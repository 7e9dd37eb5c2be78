"""The seam between the plugin and wherever its GPUs come from.

A device source reports the GPUs usable on this node right now. Sources differ only in
how they find them (a file, the fabric manager's Redfish service, NVML); everything
downstream (slices, prepare) sees the same :class:`DeviceInfo`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from composable_dra.process import logs

Attachment = Literal["local", "fabric", "remote"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def is_dns_label(name: str) -> bool:
    return bool(_DNS_LABEL.match(name))


def device_name_for(uuid: str, prefix: str = "gpu") -> str:
    """A stable DNS label for a device, derived from its UUID.

    Names follow the device, not its enumeration index, so attaching or detaching one GPU
    never renames the others.
    """
    cleaned = re.sub(r"[^a-z0-9]+", "-", uuid.lower()).strip("-")
    if cleaned.startswith(prefix + "-"):
        cleaned = cleaned[len(prefix) + 1 :]
    name = f"{prefix}-{cleaned}" if cleaned else prefix
    return name[:63].rstrip("-")


class DeviceInfo(BaseModel):
    """One GPU as the plugin publishes and prepares it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="DNS label, unique on the node")
    uuid: str
    product_name: str = ""
    model: str = ""
    attachment: Attachment = "local"
    pci_bus_id: str | None = None
    memory_bytes: int | None = Field(default=None, ge=0)
    # Host device nodes a container needs for this device (nvml only).
    device_nodes: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not is_dns_label(value):
            raise ValueError(f"device name {value!r} is not a DNS label")
        return value


class ProcessesUnknown(Exception):
    """A source could not say which processes use a device (its driver did not answer)."""


class DeviceSource(Protocol):
    """Where the node's GPUs come from."""

    name: str
    # How often :class:`SourceWatcher` asks again; cheap sources ask often.
    poll_interval: float

    def list_devices(self) -> list[DeviceInfo]:
        """The devices present now; raises when the source cannot be read."""
        ...

    def close(self) -> None: ...


def check_unique(devices: Sequence[DeviceInfo]) -> list[DeviceInfo]:
    """Drop devices whose name or UUID repeats an earlier one (first wins), sorted by name."""
    seen_names: set[str] = set()
    seen_uuids: set[str] = set()
    out: list[DeviceInfo] = []
    for dev in devices:
        if dev.name in seen_names or dev.uuid in seen_uuids:
            logs.get(__name__).warning("duplicate device ignored", device=dev.name, uuid=dev.uuid)
            continue
        seen_names.add(dev.name)
        seen_uuids.add(dev.uuid)
        out.append(dev)
    return sorted(out, key=lambda d: d.name)


class SourceWatcher:
    """Polls a source in a thread and reports each changed device list.

    Errors keep the last good list (a fabric manager that blips must not unpublish every
    GPU); they are logged and retried on the next tick.
    """

    def __init__(
        self,
        source: DeviceSource,
        on_change: Callable[[list[DeviceInfo]], None],
    ) -> None:
        self._source = source
        self._on_change = on_change
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._devices: list[DeviceInfo] | None = None
        self._log = logs.get(__name__, source=source.name)

    @property
    def devices(self) -> list[DeviceInfo]:
        with self._lock:
            return list(self._devices or [])

    def poll_once(self) -> bool:
        """Read the source; True when the list changed (and on_change was called)."""
        devices = self._read()
        if devices is None or not self._store(devices):
            return False
        self._on_change(devices)
        return True

    def read_now(self) -> list[DeviceInfo] | None:
        """Read the source and keep its list, without calling on_change (its caller acts on
        the list itself); None when the source cannot be read."""
        devices = self._read()
        if devices is not None:
            self._store(devices)
        return devices

    def _read(self) -> list[DeviceInfo] | None:
        try:
            return check_unique(self._source.list_devices())
        except Exception as exc:
            self._log.warning("device source failed", error=str(exc))
            return None

    def _store(self, devices: list[DeviceInfo]) -> bool:
        """Keep ``devices`` as the list; True when it changed."""
        with self._lock:
            if devices == self._devices:
                return False
            self._devices = devices
        self._log.info("devices changed", devices=[d.name for d in devices])
        return True

    def start(self) -> None:
        self.poll_once()
        self._thread = threading.Thread(target=self._loop, name="device-source", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._source.poll_interval):
            self.poll_once()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._source.close()
