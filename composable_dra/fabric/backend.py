"""The fabric backend seam: what the operator and the pool publisher need of a fabric.

A backend is synchronous (fabric client libraries are); callers run it in a thread.
Every call reads the fabric afresh: nothing here caches state that could go stale
between a read and the change it decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from composable_dra.model.health import Reason

# Re-exported: callers of a backend compare the UUIDs it reports with it.
from composable_dra.model.names import normalize_uuid as normalize_uuid

DeviceState = Literal["free", "attached", "busy"]


@dataclass(frozen=True, slots=True)  # thousands per inventory read
class Host:
    """A fabric host (Redfish ComputerSystem) that a node runs on."""

    id: str
    uuid: str
    name: str = ""


@dataclass(frozen=True, slots=True)
class Device:
    """A fabric device (a GPU resource block)."""

    id: str
    model: str
    zone: str
    uuid: str  # the GPU's UUID as the host sees it once attached
    state: DeviceState
    host: str | None = None  # the host it is attached to
    memory_mib: int = 0
    manufacturer: str = ""
    fault: Reason | None = None  # what the fabric manager reports wrong with it (None: ok)


@dataclass(frozen=True, slots=True)
class Zone:
    """Devices and the hosts they can be attached to."""

    id: str
    hosts: frozenset[str]
    devices: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Inventory:
    hosts: dict[str, Host]
    devices: dict[str, Device]
    zones: dict[str, Zone]
    # A fabric that picks the device at attach (DevicePicker): its free GPUs as counts by
    # (zone, model), without identity; ``devices`` then holds the attached ones only.
    free_counts: dict[tuple[str, str], int] = field(default_factory=dict)

    def host_by_uuid(self, uuid: str) -> Host | None:
        return host_by_uuid(self.hosts, uuid)


def host_by_uuid(hosts: Mapping[str, Host], uuid: str) -> Host | None:
    wanted = normalize_uuid(uuid)
    return next((h for h in hosts.values() if normalize_uuid(h.uuid) == wanted), None)


@dataclass(frozen=True)
class Operation:
    """A change the fabric accepted and runs asynchronously (a Redfish task monitor)."""

    monitor: str
    task: str | None = None
    retry_after: float = 1.0


@dataclass(frozen=True)
class OperationStatus:
    state: Literal["running", "done", "failed"]
    message: str = ""
    retry_after: float = 1.0


class FabricBackend(Protocol):
    def inventory(self) -> Inventory:
        """Hosts, devices (with their state) and zones, read from the fabric now."""
        ...

    def hosts(self) -> dict[str, Host]:
        """The hosts alone, read now: what mapping a node to its host needs."""
        ...

    def device(self, device_id: str) -> Device | None:
        """One device and its state, read now; None when the fabric does not know it."""
        ...

    def attach(self, device_id: str, host_id: str) -> Operation | None:
        """Start attaching; None when the fabric finished it synchronously."""
        ...

    def detach(self, device_id: str, host_id: str) -> Operation | None:
        """Start detaching; None when the fabric finished it synchronously."""
        ...

    def operation_status(self, op: Operation) -> OperationStatus: ...

    def close(self) -> None: ...


class DevicePicker(Protocol):
    """A fabric that attaches a device of a model that it picks itself (the Fsas FM as
    CoHDI uses it), rather than one named by the caller. Detach still names the device.
    Its inventory lists free capacity in ``free_counts``; a device that no host has is
    unknown to ``device`` (None)."""

    picks_device: bool  # True when attach by id is not available

    def attach_model(self, model: str, host_id: str) -> Device:
        """Attach one device of the model to the host, synchronously: the one attached."""
        ...

    def host_devices(self, host_id: str) -> list[Device]:
        """The devices attached to one host, read now."""
        ...


def picker(backend: object) -> DevicePicker | None:
    """The backend as a DevicePicker when it picks the device at attach, else None."""
    if getattr(backend, "picks_device", False) is True:
        return backend  # type: ignore[return-value]
    return None
