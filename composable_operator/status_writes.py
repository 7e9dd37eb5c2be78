"""What this operator owns of each ComposableResource's status, and its writes, in order.

Each write is one server-side apply of everything the operator owns (its fields and its
conditions; the node's plugin keeps its own DeviceVisible), so writes of one resource go
out one after another, each over the last one's state. ``StatusWrites`` keeps that state
and the write under way, per resource name; nothing else touches them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names

PLURAL = "composableresources"
MANAGER = "composable-operator"

# What this operator writes of a ComposableResource's status (one server-side apply of
# all of it per write); the node's plugin owns DeviceVisible.
OWNED_FIELDS = (
    "phase",
    "error",
    "deviceUUID",
    "fabricHost",
    "attachedAt",
    "pendingAttach",
    "fabricDeviceID",
)
OWNED_CONDITIONS = (names.ATTACHED, names.READY, names.RELEASE_REQUESTED)


def owned_status(status: Mapping[str, Any]) -> JSON:
    """The part of a status this operator owns."""
    out: JSON = {k: status[k] for k in OWNED_FIELDS if status.get(k) is not None}
    conditions = [c for c in status.get("conditions") or [] if c.get("type") in OWNED_CONDITIONS]
    if conditions:
        out["conditions"] = conditions
    return out


def with_changes(owned: Mapping[str, Any], fields: JSON, conditions: list[JSON]) -> JSON:
    """``owned`` with these fields (None drops one) and conditions (replacing those of
    their type)."""
    out: JSON = {k: v for k, v in owned.items() if k != "conditions"}
    for k, v in fields.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    merged = {c["type"]: c for c in owned.get("conditions") or []}
    merged.update({c["type"]: c for c in conditions})
    if merged:
        out["conditions"] = list(merged.values())
    return out


def _status_of(obj: Any) -> Mapping[str, Any]:
    status = obj.get("status") if isinstance(obj, Mapping) else None
    return status if isinstance(status, Mapping) else {}


@dataclass
class StatusWrites:
    """Per resource name: what this operator owns of its status, as last written or seen,
    and the last write under way (see the module docstring)."""

    kube: Kube
    _owned: dict[str, JSON] = field(default_factory=dict)
    _writes: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def owned(self, name: str) -> JSON | None:
        """What this process holds of the resource's status (None: nothing yet)."""
        return self._owned.get(name)

    def known(self, name: str, status: Mapping[str, Any]) -> None:
        """What this operator owns of a resource's status, as the live object shows it,
        unless this process has written it since (its own writes are newer)."""
        if name not in self._owned:
            self._owned[name] = owned_status(status)

    def forget(self, name: str) -> None:
        self._owned.pop(name, None)

    def drop(self, name: str, key: str) -> None:
        """Leave ``key`` out of the next write, with no write of its own."""
        owned = self._owned.get(name)
        if owned is not None:
            self._owned[name] = {k: v for k, v in owned.items() if k != key}

    def apply(self, name: str, status: JSON) -> None:
        """One server-side apply of everything this operator owns of the status. A field
        left out is dropped, since this manager owned it; one that another manager still
        shares (a merge patch of an older operator) is dropped with a merge patch."""
        status_path = path(API_VERSION, PLURAL, name, subresource="status")
        written = self.kube.apply(
            status_path,
            {
                "apiVersion": API_VERSION,
                "kind": "ComposableResource",
                "metadata": {"name": name},
                "status": status,
            },
            MANAGER,
        )
        left = [k for k in OWNED_FIELDS if k not in status and k in _status_of(written)]
        if left:
            self.kube.merge_patch(status_path, {"status": dict.fromkeys(left)})

    def queue(self, name: str, fields: JSON, conditions: list[JSON]) -> asyncio.Task[None]:
        """Queue one write of the resource's status with these changes, after the writes
        queued before it (each carries the whole owned status, so order matters)."""
        state = with_changes(self._owned.get(name) or {}, fields, conditions)
        self._owned[name] = state
        previous = self._writes.get(name)

        async def write() -> None:
            if previous is not None:
                await asyncio.wait([previous])  # in order, whatever became of it
            await asyncio.to_thread(self.apply, name, state)

        task = asyncio.ensure_future(write())
        self._writes[name] = task

        def done(t: asyncio.Task[None]) -> None:
            if self._writes.get(name) is t:
                del self._writes[name]

        task.add_done_callback(done)
        return task

    async def write(self, name: str, fields: JSON, conditions: list[JSON] | None = None) -> None:
        """One write: these fields (None drops one) and conditions over what this operator
        owns of the status already."""
        await self.queue(name, fields, conditions or [])

    async def written(self, name: str) -> None:
        """Until the status writes under way for a resource are done."""
        while (task := self._writes.get(name)) is not None:
            await asyncio.wait([task])
