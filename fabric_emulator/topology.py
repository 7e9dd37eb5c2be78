"""The fabric's fixed shape: hosts, zones and GPU resource blocks.

A topology file is YAML or JSON (JSON is YAML, so one loader reads both)::

    hosts:                      # one Redfish ComputerSystem each
      - id: node-a              # required; a DNS-label-like id, used in URIs
        uuid: 4c4c4544-...      # optional; default uuid5(namespace, "host:<id>")
        name: Node A            # optional
    zones:                      # one Redfish ResourceZone each
      - id: zone-1              # required
        hosts: [node-a, node-b] # the hosts this zone's blocks can be attached to
        blocks:                 # the GPU resource blocks in this zone
          - id: gpu-1           # required, unique over the whole topology
            model: NVIDIA H100 80GB HBM3     # required
            manufacturer: NVIDIA             # optional, default "NVIDIA"
            memory_mib: 81920                # optional, default 81920
            memory_type: HBM3                # optional, a Redfish ProcessorMemoryType
            uuid: GPU-...                    # optional; default "GPU-" + uuid5("gpu:<id>")

``uuid`` of a block is the GPU UUID as the host sees it (nvidia-smi style, ``GPU-`` and
a UUID); the Redfish ``Processor.UUID`` carries the UUID part without the prefix. A host
may be in several zones; a block is in exactly one.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Fixed so that ids map to the same UUIDs in every run and on every machine.
NAMESPACE = uuid.UUID("6f1e9c1a-3b7d-5e2f-9a41-0c8d2b7e5a10")

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_MEMORY_TYPES = frozenset(
    {"HBM1", "HBM2", "HBM2E", "HBM3", "GDDR5", "GDDR5X", "GDDR6", "GDDR7", "DDR4", "DDR5"}
)


class TopologyError(ValueError):
    """The topology file is not valid."""


def host_uuid(host_id: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"host:{host_id}"))


def gpu_uuid(block_id: str) -> str:
    return "GPU-" + str(uuid.uuid5(NAMESPACE, f"gpu:{block_id}"))


@dataclass(frozen=True, slots=True)  # thousands at a fabric's scale
class Host:
    """An expandable ComputerSystem: ``uuid`` is the node's systemUUID."""

    id: str
    uuid: str
    name: str


@dataclass(frozen=True, slots=True)
class Block:
    id: str
    zone: str
    model: str
    manufacturer: str
    memory_mib: int
    memory_type: str
    uuid: str

    @property
    def redfish_uuid(self) -> str:
        """The UUID in Redfish's ``Processor.UUID`` form (no ``GPU-`` prefix)."""
        return self.uuid.removeprefix("GPU-")


@dataclass(frozen=True, slots=True)
class Zone:
    id: str
    hosts: tuple[str, ...]
    blocks: tuple[str, ...]


@dataclass(frozen=True)
class Topology:
    hosts: dict[str, Host] = field(default_factory=dict)
    zones: dict[str, Zone] = field(default_factory=dict)
    blocks: dict[str, Block] = field(default_factory=dict)

    def zones_of_host(self, host_id: str) -> list[str]:
        return [z.id for z in self.zones.values() if host_id in z.hosts]

    def reachable(self, block_id: str, host_id: str) -> bool:
        block = self.blocks.get(block_id)
        return block is not None and host_id in self.zones[block.zone].hosts


def _str(raw: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value:
        raise TopologyError(f"{where}: {key!r} must be a non-empty string")
    return value


def _ident(raw: dict[str, Any], where: str) -> str:
    value = _str(raw, "id", where)
    if not _ID.match(value):
        raise TopologyError(f"{where}: id {value!r} must match {_ID.pattern}")
    return value


def _uuid(value: str, where: str) -> str:
    try:
        return str(uuid.UUID(value.removeprefix("GPU-")))
    except ValueError as exc:
        raise TopologyError(f"{where}: {value!r} is not a UUID") from exc


def _entries(
    items: Any, where: str, taken: Callable[[str], bool], what: str
) -> Iterator[tuple[str, dict[str, Any], str]]:
    """Each entry of a list with its place (for errors) and its id, checked: a mapping
    with a valid id that is not ``taken`` (``what``: the noun for that error)."""
    for i, raw in enumerate(items or []):
        at = f"{where}[{i}]"
        if not isinstance(raw, dict):
            raise TopologyError(f"{at}: must be a mapping")
        ident = _ident(raw, at)
        if taken(ident):
            raise TopologyError(f"{at}: duplicate {what}id {ident!r}")
        yield at, raw, ident


def parse(data: Any) -> Topology:
    """Build a topology from the parsed file; raise TopologyError on anything wrong."""
    if not isinstance(data, dict):
        raise TopologyError("the topology must be a mapping with 'hosts' and 'zones'")
    hosts: dict[str, Host] = {}
    for where, raw, hid in _entries(data.get("hosts"), "hosts", hosts.__contains__, "host "):
        huuid = _uuid(raw["uuid"], where) if "uuid" in raw else host_uuid(hid)
        hosts[hid] = Host(id=hid, uuid=huuid, name=_str(raw, "name", where, hid))
    if not hosts:
        raise TopologyError("the topology needs at least one host")
    zones: dict[str, Zone] = {}
    blocks: dict[str, Block] = {}

    def _taken(ident: str) -> bool:  # block ids share a namespace with hosts' blocks
        return ident in blocks or ident in hosts

    for where, raw, zid in _entries(data.get("zones"), "zones", zones.__contains__, "zone "):
        zone_hosts = raw.get("hosts") or []
        if not isinstance(zone_hosts, list):
            raise TopologyError(f"{where}: hosts must be a list")
        for h in zone_hosts:
            if h not in hosts:
                raise TopologyError(f"{where}: unknown host {h!r}")
        ids: list[str] = []
        for bwhere, braw, bid in _entries(raw.get("blocks"), f"{where}.blocks", _taken, ""):
            if bid.startswith("system-"):
                raise TopologyError(f"{bwhere}: ids starting 'system-' are reserved")
            memory = braw.get("memory_mib", 81920)
            if not isinstance(memory, int) or isinstance(memory, bool) or memory <= 0:
                raise TopologyError(f"{bwhere}: memory_mib must be a positive integer")
            mtype = _str(braw, "memory_type", bwhere, "HBM3")
            if mtype not in _MEMORY_TYPES:
                raise TopologyError(f"{bwhere}: memory_type must be one of {sorted(_MEMORY_TYPES)}")
            buuid = "GPU-" + _uuid(braw["uuid"], bwhere) if "uuid" in braw else gpu_uuid(bid)
            blocks[bid] = Block(
                id=bid,
                zone=zid,
                model=_str(braw, "model", bwhere),
                manufacturer=_str(braw, "manufacturer", bwhere, "NVIDIA"),
                memory_mib=memory,
                memory_type=mtype,
                uuid=buuid,
            )
            ids.append(bid)
        zones[zid] = Zone(id=zid, hosts=tuple(zone_hosts), blocks=tuple(ids))
    return Topology(hosts=hosts, zones=zones, blocks=blocks)


def load(path: str | Path) -> Topology:
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path}: {exc}") from exc
    return parse(data)


H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"


def default() -> Topology:
    """Three hosts, two zones, eight GPU blocks of two models.

    zone-1 reaches node-1 and node-2 (4 x H100, 1 x L40S); zone-2 reaches node-2 and node-3
    (1 x H100, 2 x L40S).
    """

    def gpu(bid: str, model: str) -> dict[str, Any]:
        if model == H100:
            return {"id": bid, "model": model, "memory_mib": 81559, "memory_type": "HBM3"}
        return {"id": bid, "model": model, "memory_mib": 46068, "memory_type": "GDDR6"}

    return parse(
        {
            "hosts": [{"id": "node-1"}, {"id": "node-2"}, {"id": "node-3"}],
            "zones": [
                {
                    "id": "zone-1",
                    "hosts": ["node-1", "node-2"],
                    "blocks": [
                        gpu("gpu-1", H100),
                        gpu("gpu-2", H100),
                        gpu("gpu-3", H100),
                        gpu("gpu-4", H100),
                        gpu("gpu-5", L40S),
                    ],
                },
                {
                    "id": "zone-2",
                    "hosts": ["node-2", "node-3"],
                    "blocks": [gpu("gpu-6", H100), gpu("gpu-7", L40S), gpu("gpu-8", L40S)],
                },
            ],
        }
    )


def dumps(topology: Topology) -> str:
    """The topology in the file format (JSON), for tools that want to hand it on."""
    return json.dumps(
        {
            "hosts": [
                {"id": h.id, "uuid": h.uuid, "name": h.name} for h in topology.hosts.values()
            ],
            "zones": [
                {
                    "id": z.id,
                    "hosts": list(z.hosts),
                    "blocks": [
                        {
                            "id": b.id,
                            "model": b.model,
                            "manufacturer": b.manufacturer,
                            "memory_mib": b.memory_mib,
                            "memory_type": b.memory_type,
                            "uuid": b.uuid,
                        }
                        for b in (topology.blocks[i] for i in z.blocks)
                    ],
                }
                for z in topology.zones.values()
            ],
        },
        indent=2,
    )
