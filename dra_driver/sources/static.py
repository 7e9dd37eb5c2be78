"""The static source: devices listed in a YAML or JSON file, re-read when it changes.

File format::

    devices:
      - uuid: GPU-0a1b...           # required
        name: gpu-0                  # optional DNS label; derived from the UUID otherwise
        productName: NVIDIA A100-SXM4-80GB
        model: A100
        attachment: local            # local | fabric | remote
        pciBusID: "0000:3b:00.0"
        memory: 80Gi                 # a quantity, or bytes as an integer

A missing file means no devices (a test or a demo may create it later).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from composable_dra.k8s.quantity import parse_bytes
from dra_driver.device_source import Attachment, DeviceInfo, device_name_for


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    uuid: str = Field(min_length=1)
    name: str | None = None
    product_name: str = Field(default="", alias="productName")
    model: str = ""
    attachment: Attachment = "local"
    pci_bus_id: str | None = Field(default=None, alias="pciBusID")
    memory: int | str | None = None


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    devices: list[_Entry] = Field(default_factory=list)


def parse_static(text: str) -> list[DeviceInfo]:
    """Devices from the file's text; raises ValueError (pydantic's) on a bad file."""
    raw: Any = yaml.safe_load(text) or {}
    parsed = _File.model_validate(raw)
    return [
        DeviceInfo(
            name=e.name or device_name_for(e.uuid),
            uuid=e.uuid,
            product_name=e.product_name,
            model=e.model,
            attachment=e.attachment,
            pci_bus_id=e.pci_bus_id,
            memory_bytes=None if e.memory is None else parse_bytes(e.memory),
        )
        for e in parsed.devices
    ]


class StaticSource:
    name = "static"

    def __init__(self, path: Path, poll_interval: float = 0.5) -> None:
        self.path = path
        self.poll_interval = poll_interval
        self._stamp: tuple[int, int, int] | None = None
        self._devices: list[DeviceInfo] = []

    def list_devices(self) -> list[DeviceInfo]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._devices = None, []
            return []
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp != self._stamp:
            # Parse before remembering the stamp: a half-written file is read again.
            self._devices = parse_static(self.path.read_text())
            self._stamp = stamp
        return list(self._devices)

    def close(self) -> None:
        pass
