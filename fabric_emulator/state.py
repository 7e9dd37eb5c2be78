"""The composition: which GPU block is attached to which host, and the rules for changing it.

Everything here is pure and synchronous: ``check_change`` decides whether a change is
allowed (raising :class:`RedfishError` with the status and registry messages to answer),
``apply_change`` makes it. The HTTP layer serialises both under one lock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fabric_emulator import messages
from fabric_emulator.topology import Topology

SYSTEM_BLOCK_PREFIX = "system-"


def system_block_id(host_id: str) -> str:
    """The ResourceBlock of type ComputerSystem that stands for a host in its zones."""
    return SYSTEM_BLOCK_PREFIX + host_id


class RedfishError(Exception):
    """An error response: HTTP status, registry messages, extra headers."""

    def __init__(
        self, status: int, *msgs: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(msgs[0]["Message"] if msgs else str(status))
        self.status = status
        self.messages = list(msgs)
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return messages.error_body(*self.messages)


@dataclass
class Composition:
    """Mutable composition state. ``attached`` is what a restart keeps."""

    attached: dict[str, str] = field(default_factory=dict)  # block -> host
    composing: dict[str, str] = field(default_factory=dict)  # block -> host, async attach
    detaching: dict[str, str] = field(default_factory=dict)  # block -> host, async detach
    # block -> the Redfish Status a test set (fabric_emulator/block_status.py); else OK
    status: dict[str, dict[str, str]] = field(default_factory=dict)

    def blocks_of(self, host_id: str) -> list[str]:
        return sorted(b for b, h in self.attached.items() if h == host_id)

    def state_of(self, block_id: str) -> str:
        """The Redfish CompositionState of a GPU block."""
        if block_id in self.attached:
            return "Composed"
        if block_id in self.composing:
            return "Composing"
        return "Unused"

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "attached": dict(sorted(self.attached.items()))}

    @classmethod
    def from_json(cls, data: Any, topology: Topology) -> Composition:
        """Load a saved composition, keeping only what the topology still allows."""
        attached: dict[str, str] = {}
        if isinstance(data, dict) and isinstance(data.get("attached"), dict):
            for block, host in data["attached"].items():
                if isinstance(host, str) and topology.reachable(block, host):
                    attached[block] = host
        return cls(attached=attached)


ADD = "ComputerSystem.AddResourceBlock"
REMOVE = "ComputerSystem.RemoveResourceBlock"


def block_id_from_uri(uri: str) -> str | None:
    prefix = "/redfish/v1/CompositionService/ResourceBlocks/"
    rest = uri.rstrip("/")
    if not rest.startswith(prefix):
        return None
    block = rest[len(prefix) :]
    return block if block and "/" not in block else None


def check_change(
    topology: Topology,
    comp: Composition,
    host_id: str,
    add: Iterable[str],
    remove: Iterable[str],
) -> None:
    """Raise RedfishError unless adding ``add`` to and removing ``remove`` from the host is
    allowed now. Pending (async) changes count as in use."""
    if host_id not in topology.hosts:
        raise RedfishError(404, messages.base("ResourceNotFound", "ComputerSystem", host_id))
    own = system_block_id(host_id)
    for block in add:
        if block == own or (block.startswith(SYSTEM_BLOCK_PREFIX) and block[7:] in topology.hosts):
            raise RedfishError(400, messages.composition("ResourceBlockInvalid", block))
        if block not in topology.blocks:
            raise RedfishError(400, messages.composition("ResourceBlockNotFound", block))
        if block in comp.attached or block in comp.composing or block in comp.detaching:
            raise RedfishError(409, messages.composition("ResourceBlockInUse", block))
        if not topology.reachable(block, host_id):
            raise RedfishError(400, messages.composition("IncompatibleZone"))
    for block in remove:
        if block == own:
            raise RedfishError(400, messages.composition("ResourceBlockInvalid", block))
        if block not in topology.blocks and not (
            block.startswith(SYSTEM_BLOCK_PREFIX) and block[7:] in topology.hosts
        ):
            raise RedfishError(400, messages.composition("ResourceBlockNotFound", block))
        if block in comp.detaching:
            raise RedfishError(409, messages.base("ResourceInUse"))
        if comp.attached.get(block) != host_id:
            raise RedfishError(400, messages.composition("ResourceBlockInvalid", block))


def apply_change(
    comp: Composition, host_id: str, add: Iterable[str], remove: Iterable[str]
) -> None:
    for block in remove:
        comp.attached.pop(block, None)
        comp.detaching.pop(block, None)
    for block in add:
        comp.composing.pop(block, None)
        comp.attached[block] = host_id


def reserve(comp: Composition, host_id: str, add: Iterable[str], remove: Iterable[str]) -> None:
    """Mark an accepted asynchronous change as pending."""
    for block in add:
        comp.composing[block] = host_id
    for block in remove:
        comp.detaching[block] = host_id


def release(comp: Composition, add: Iterable[str], remove: Iterable[str]) -> None:
    """Forget a pending change that failed."""
    for block in add:
        comp.composing.pop(block, None)
    for block in remove:
        comp.detaching.pop(block, None)


def diff_links(
    topology: Topology, comp: Composition, host_id: str, desired_uris: list[str]
) -> tuple[list[str], list[str]]:
    """Turn a PATCHed ``Links.ResourceBlocks`` into (add, remove).

    The host's own ComputerSystem block may be listed or left out; it always stays.
    """
    desired: list[str] = []
    for uri in desired_uris:
        block = block_id_from_uri(uri)
        if block is None:
            raise RedfishError(
                400,
                messages.base("PropertyValueIncorrect", "Links/ResourceBlocks", uri),
            )
        if block == system_block_id(host_id):
            continue
        if block not in desired:
            desired.append(block)
    current = comp.blocks_of(host_id)
    add = [b for b in desired if b not in current]
    remove = [b for b in current if b not in desired]
    return add, remove
