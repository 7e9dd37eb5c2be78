"""The redfish source: the GPUs the fabric manager reports attached to this node's host.

The host is the ComputerSystem whose ``UUID`` equals the node's
``status.nodeInfo.systemUUID``; its GPUs are the members of its ``Processors`` collection
with ``ProcessorType`` ``GPU``. Credentials come from a file or the environment and never
reach a log line; TLS is verified (system CAs, or the given CA file).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from composable_dra.fabric import health as fabric_health
from composable_dra.fabric import members
from composable_dra.fabric.connection import Connection
from composable_dra.fabric.health import redfish_fault
from composable_dra.model.health import HealthReport, Reason
from dra_driver.device_source import DeviceInfo, device_name_for

_MiB = 2**20
# The source's default: verified against the system bundle, each read within 5 s.
QUICK = Connection(timeout=5.0)


class RedfishError(RuntimeError):
    pass


@dataclass(frozen=True)
class RedfishCredentials:
    username: str
    password: str

    def __repr__(self) -> str:  # never print the password by accident
        return f"RedfishCredentials(username={self.username!r}, password='[redacted]')"


def load_credentials(path: Path | None) -> RedfishCredentials | None:
    """From a YAML/JSON file with ``username`` and ``password``, else REDFISH_USERNAME/PASSWORD."""
    if path is not None:
        raw: Any = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict) or "username" not in raw or "password" not in raw:
            raise RedfishError(f"credentials file {path} needs 'username' and 'password'")
        return RedfishCredentials(str(raw["username"]), str(raw["password"]))
    user, password = os.environ.get("REDFISH_USERNAME"), os.environ.get("REDFISH_PASSWORD")
    if user and password is not None:
        return RedfishCredentials(user, password)
    return None


def gpu_from_processor(proc: dict[str, Any]) -> DeviceInfo | None:
    """A DeviceInfo from a Redfish Processor resource, or None when it is no usable GPU."""
    if proc.get("ProcessorType") != "GPU":
        return None
    uuid = proc.get("UUID")
    if not uuid:
        return None
    state = (proc.get("Status") or {}).get("State")
    if state in {"Absent", "Disabled", "UnavailableOffline"}:
        return None
    model = str(proc.get("Model") or "")
    manufacturer = str(proc.get("Manufacturer") or "")
    memory_mib: int | None = None
    summary = proc.get("MemorySummary") or {}
    if isinstance(summary.get("TotalMemorySizeMiB"), int):
        memory_mib = summary["TotalMemorySizeMiB"]
    else:
        sizes = [
            m.get("CapacityMiB")
            for m in proc.get("ProcessorMemory") or []
            if isinstance(m.get("CapacityMiB"), int)
        ]
        if sizes:
            memory_mib = sum(sizes)
    pci_bus_id = None
    oem_pcie = ((proc.get("Oem") or {}).get("ComposableDRA") or {}).get("PCIeBusID")
    if isinstance(oem_pcie, str):
        pci_bus_id = oem_pcie
    return DeviceInfo(
        name=device_name_for(str(uuid)),
        uuid=str(uuid),
        product_name=f"{manufacturer} {model}".strip() or str(proc.get("Name") or ""),
        model=model,
        attachment="fabric",
        pci_bus_id=pci_bus_id,
        memory_bytes=None if memory_mib is None else memory_mib * _MiB,
    )


class RedfishSource:
    name = "redfish"

    def __init__(
        self,
        endpoint: str,
        system_uuid: str,
        credentials: RedfishCredentials | None = None,
        connection: Connection = QUICK,
        poll_interval: float = 2.0,
    ) -> None:
        import redfish

        # The library logs request headers (the Authorization header among them) at debug.
        logging.getLogger("redfish").setLevel(logging.WARNING)
        self.poll_interval = poll_interval
        self.system_uuid = system_uuid.lower()
        self._client: Any = redfish.redfish_client(
            base_url=endpoint,
            cafile=connection.ca_bundle(),
            timeout=connection.timeout,
            max_retry=1,
            check_connectivity=False,
        )
        self._credentials = credentials
        self._logged_in = False
        self._system_path: str | None = None
        self.endpoint = endpoint
        self._expand: members.Expand | None = None  # what the ServiceRoot advertises
        self._faults: dict[str, Reason | None] = {}

    def _get(self, path: str) -> dict[str, Any]:
        if self._credentials is not None and not self._logged_in:
            self._client.login(
                username=self._credentials.username,
                password=self._credentials.password,
                auth="basic",
            )
            self._logged_in = True
        resp = self._client.get(path)
        if resp.status != 200:
            raise RedfishError(f"GET {path}: HTTP {resp.status}")
        body: dict[str, Any] = resp.dict
        return body

    def _members(self, path: str) -> list[dict[str, Any]]:
        """A collection's members, inlined where the service can (members.py)."""
        if self._expand is None:
            self._expand = members.expand_of(self._get(f"{members.ROOT}/"))
        try:
            return members.members(self._get, path, self.endpoint, self._expand)
        except members.PagingError as exc:
            raise RedfishError(str(exc)) from exc

    def _find_system(self) -> str:
        for system in self._members(f"{members.ROOT}/Systems"):
            if str(system.get("UUID", "")).lower() == self.system_uuid:
                return str(system["@odata.id"])
        raise RedfishError(f"no ComputerSystem with UUID {self.system_uuid}")

    def list_devices(self) -> list[DeviceInfo]:
        if self._system_path is None:
            self._system_path = self._find_system()
        try:
            system = self._get(self._system_path)
        except RedfishError:
            self._system_path = None  # the system moved or vanished: look it up again
            raise
        processors = (system.get("Processors") or {}).get("@odata.id")
        if not processors:
            return []
        devices = []
        faults: dict[str, Reason | None] = {}
        for proc in self._members(processors):
            dev = gpu_from_processor(proc)
            if dev is not None:
                devices.append(dev)
            if proc.get("ProcessorType") == "GPU" and proc.get("UUID"):
                faults[device_name_for(str(proc["UUID"]))] = redfish_fault(proc)
        self._faults = faults  # one assignment: reports() reads it from another thread
        return devices

    def reports(self) -> list[HealthReport]:
        """The fabric's word on this host's GPUs at the last read (a HealthSource): an
        Absent one, which list_devices leaves out, is reported too."""
        return [fabric_health.report(name, fault) for name, fault in self._faults.items()]

    def close(self) -> None:
        self._client = None
