"""Attaches on a fabric that picks the device (backend.DevicePicker; fabric/slots.py).

A resource for such a fabric names a pool *slot* (spec.deviceID) and its model; the
fabric attaches a GPU of that model of its own choosing, and the one it answers is the
resource's device from then on: kept in memory at once (``Picks``, which owns this
process's picks) and recorded in status.fabricDeviceID. Every read of the resource's
device (attach daemon, detach) goes through ``Picks.read_device``, and so does the
detach, by the recorded id.

Nothing may be attached that no resource records, even when the answer is lost (a
dropped connection, the operator killed): attaches to one host are made one at a time
(a lock per host), status.pendingAttach records the host's devices before the request
(machineResources) and is on the API server before the request goes, and a resource
with such a record and no pick finds its device again as the one the host has now that
it had not then and no other resource records (slots.recover_pick), or, once a request
can no longer land (REQUEST_SETTLE_SECONDS), drops the record and attaches afresh.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api.v1alpha1 import API_VERSION, ComposableResourceSpec
from composable_dra.fabric.backend import Device, DevicePicker, FabricBackend, Operation, picker
from composable_dra.fabric.errors import FabricError, TransientError
from composable_dra.fabric.slots import is_slot, recover_pick
from composable_dra.k8s.kube import Kube, path
from composable_dra.process import logs
from composable_operator.attach_calls import AttachCall, AttachCalls
from composable_operator.reconcile import REQUEST_SETTLE_SECONDS, AttachRecord, parse_attach_record

log = logs.get(__name__)


def picks_for(backend: FabricBackend, spec: ComposableResourceSpec) -> DevicePicker | None:
    """The backend as a picker when this resource is a slot on a fabric that picks."""
    p = picker(backend)
    return p if p is not None and is_slot(spec.device_id) else None


def slot_device(spec: ComposableResourceSpec, state: str) -> Device:
    """The slot as a device: free (attach it), or busy (an attach may be landing)."""
    return Device(
        id=spec.device_id,
        model=spec.model or "",
        zone="",
        uuid="",
        state="busy" if state == "busy" else "free",
    )


def held_by_others(items: list[Any], picked: Mapping[str, str], fabric: str, uid: str) -> set[str]:
    """Device ids that other resources of the fabric hold: what a recovery must not take.

    This process's picks (ahead of the status writes) of resources that still exist, and
    what the API server shows (``items``), less the records of resources being deleted: a
    device new on the host since our request cannot be one that such a resource still
    holds (it would have been there before), and the record of one whose detach just
    ended is stale. (A pick of this process for a resource being deleted counts until it
    is gone.)
    """
    present = {
        str(r["metadata"].get("uid")): r
        for r in items
        if (r.get("spec") or {}).get("fabric") == fabric and r["metadata"].get("uid") != uid
    }
    held = {i for other, i in picked.items() if other in present}
    for r in present.values():
        if r["metadata"].get("deletionTimestamp"):
            continue
        held.add(str(r["spec"].get("deviceID", "")))
        if recorded := (r.get("status") or {}).get("fabricDeviceID"):
            held.add(str(recorded))
    return held


@dataclass
class Picks:
    """This process's picks (resource uid -> the fabric's device id), ahead of the status
    watch, and one lock per (fabric, host) that serialises attaches and recoveries."""

    kube: Kube
    attaches: AttachCalls
    _picked: dict[str, str] = field(default_factory=dict)
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def lock(self, fabric: str, host: str) -> asyncio.Lock:
        return self._locks.setdefault((fabric, host), asyncio.Lock())

    def remember(self, uid: str, device_id: str) -> None:
        """The fabric attached ``device_id`` for this resource (in memory only)."""
        self._picked[uid] = device_id

    def release(self, uid: str) -> None:
        """The resource's GPU is gone: no longer anyone's pick."""
        self._picked.pop(uid, None)

    def recorded(self, uid: str, status: Mapping[str, Any]) -> str | None:
        return self._picked.get(uid) or (str(status.get("fabricDeviceID") or "") or None)

    def _pick(self, uid: str, name: str, device_id: str) -> None:
        self.remember(uid, device_id)
        # After any earlier write of the record, in order; the memory copy serves meanwhile.
        self.attaches.record(name, None, {"fabricDeviceID": device_id})

    def others_recorded(self, fabric: str, uid: str) -> set[str]:
        """Device ids that other resources of the fabric hold (held_by_others)."""
        items = self.kube.get(path(API_VERSION, "composableresources"))["items"]
        return held_by_others(items, self._picked, fabric, uid)

    async def recover(
        self,
        p: DevicePicker,
        spec: ComposableResourceSpec,
        uid: str,
        host: str,
        before: tuple[str, ...],
    ) -> Device | None:
        """The device our lost attach put on the host, if it did (call under the host lock)."""
        now = await asyncio.to_thread(p.host_devices, host)
        if not [d for d in now if d.id not in before]:
            return None  # nothing new: no need to ask who holds what
        others = await asyncio.to_thread(self.others_recorded, spec.fabric, uid)
        return recover_pick(before, now, others, spec.model)

    async def read_device(
        self,
        backend: FabricBackend,
        spec: ComposableResourceSpec,
        status: Mapping[str, Any],
        uid: str,
        name: str,
    ) -> Device | None:
        """The resource's device as the fabric has it now (see the module docstring)."""
        p = picks_for(backend, spec)
        if p is None:
            return await asyncio.to_thread(backend.device, spec.device_id)
        if (rid := self.recorded(uid, status)) is not None:
            return await asyncio.to_thread(backend.device, rid)  # None: no host has it now
        if self.attaches.state(uid) == "running":
            return slot_device(spec, "busy")
        record = parse_attach_record(status)
        if record is None or record.machine_resources is None:
            return slot_device(spec, "free")
        async with self.lock(spec.fabric, record.host):
            if (rid := self.recorded(uid, status)) is not None:
                return await asyncio.to_thread(backend.device, rid)
            found = await self.recover(p, spec, uid, record.host, record.machine_resources)
            if found is not None:
                log.info("lost attach answer recovered", resource=name, device=found.id)
                self._pick(uid, name, found.id)
                return found
        if time.time() - record.requested_at < REQUEST_SETTLE_SECONDS:
            return slot_device(spec, "busy")
        await self.attaches.record(name, None, {})  # it can no longer land: start afresh
        return slot_device(spec, "free")

    def start(
        self, uid: str, name: str, p: DevicePicker, spec: ComposableResourceSpec, host: str
    ) -> AttachCall:
        """Ask the fabric for one GPU of the slot's model on the host, and record the one it
        attached (AttachCalls.start's counterpart; the same AttachCall bookkeeping)."""

        async def run() -> Operation | None:
            if not spec.model:
                raise FabricError(f"slot {spec.device_id} names no model to attach")
            async with self.lock(spec.fabric, host):
                before = tuple(d.id for d in await asyncio.to_thread(p.host_devices, host))
                record = AttachRecord(host, time.time(), machine_resources=before)
                # On the API server before the request goes: a restart must find it.
                await self.attaches.record(name, record, {"phase": "Attaching", "error": None})
                try:
                    device = await asyncio.to_thread(p.attach_model, spec.model, host)
                except FabricError as exc:
                    found = await self.recover(p, spec, uid, host, before)
                    if found is None:
                        if not isinstance(exc, TransientError):
                            self.attaches.record(name, None, {})  # answered: nothing landed
                        raise
                    log.info("lost attach answer recovered", resource=name, device=found.id)
                    device = found
                self._pick(uid, name, device.id)
            return None

        return self.attaches.run(uid, run())
