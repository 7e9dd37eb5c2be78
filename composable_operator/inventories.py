"""What the Fabric daemon's inventory pass leaves for the rest of the operator.

- Each fabric's latest inventory (``InventorySnapshot``): an Online resource checks its device
  there instead of reading the fabric itself, so 1,000 Online resources cost one
  inventory read per poll interval, not 1,000 device reads (attach_daemon.py).
- Each fabric's hosts with their UUID index: an attach step maps its node to a host
  from them instead of reading every host of the fabric; a node they do not map, or a
  fabric error on that step, reads the hosts again (hosts change rarely: a new or
  re-cabled server).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass

from composable_dra.fabric.backend import Device, Host, Inventory
from composable_dra.fabric.registry import uuid_index
from composable_dra.model.names import normalize_uuid


@dataclass(frozen=True)
class InventorySnapshot:
    inventory: Inventory
    read_at: float  # time.monotonic() when the read began
    interval: float  # the Fabric's pollIntervalSeconds at that read


@dataclass(frozen=True)
class KnownHosts:
    hosts: Mapping[str, Host]
    by_uuid: Mapping[str, str]  # registry.uuid_index(hosts)


class Inventories:
    """Per fabric: the latest inventory and the hosts (see the module docstring).

    Read from the event loop and from I/O threads; written by both."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, InventorySnapshot] = {}
        self._hosts: dict[str, KnownHosts] = {}

    def publish(self, fabric: str, inv: Inventory, read_at: float, interval: float) -> None:
        known = KnownHosts(inv.hosts, uuid_index(inv.hosts))
        with self._lock:
            self._latest[fabric] = InventorySnapshot(inv, read_at, interval)
            self._hosts[fabric] = known

    def latest(self, fabric: str) -> InventorySnapshot | None:
        with self._lock:
            return self._latest.get(fabric)

    def hosts(self, fabric: str) -> KnownHosts | None:
        with self._lock:
            return self._hosts.get(fabric)

    def set_hosts(self, fabric: str, hosts: Mapping[str, Host]) -> KnownHosts:
        known = KnownHosts(hosts, uuid_index(hosts))
        with self._lock:
            self._hosts[fabric] = known
        return known

    def forget_hosts(self, fabric: str) -> None:
        with self._lock:
            self._hosts.pop(fabric, None)

    def forget(self, fabric: str) -> None:
        with self._lock:
            self._hosts.pop(fabric, None)
            self._latest.pop(fabric, None)


def still_online(
    device: Device | None, phase: str | None, host: str | None, uuid: str | None
) -> bool:
    """An Online resource's device as an inventory shows it needs nothing done: still
    attached to the host and with the UUID the resource recorded. Anything else (detached
    or moved behind our back, a fabric that forgot it) calls for a fresh read and a
    decision (reconcile.decide_attach)."""
    return (
        phase == "Online"
        and device is not None
        and device.state == "attached"
        and host is not None
        and device.host == host
        and uuid is not None
        and normalize_uuid(device.uuid) == normalize_uuid(uuid)
    )


def online_look(
    snap: InventorySnapshot | None,
    device_id: str,
    status: Mapping[str, object],
    visible: bool,
    checked_at: float,
    max_age: float,
    now: float,
) -> float | None:
    """An Online resource between passes: when its state was last confirmed (a newer
    inventory that shows its device in place, or the last confirmation while it is not
    too old), or None when something calls for a read of the fabric and a decision: the
    device not visible any more, an inventory that shows it moved, or no inventory for
    longer than ``max_age`` (the Fabric daemon cannot read the fabric)."""
    if not visible:
        return None
    phase, host, uuid = (status.get(k) for k in ("phase", "fabricHost", "deviceUUID"))
    if snap is not None and snap.read_at > checked_at:
        device = snap.inventory.devices.get(device_id)
        ok = still_online(
            device,
            str(phase) if phase else None,
            str(host) if host else None,
            str(uuid) if uuid else None,
        )
        return snap.read_at if ok else None
    return checked_at if now - checked_at <= max_age else None
