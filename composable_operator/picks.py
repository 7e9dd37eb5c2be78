"""Attaches on a fabric that picks the device (backend.DevicePicker; fabric/slots.py).

A resource for such a fabric names a pool *slot* (spec.deviceID) and its model; the
fabric attaches a GPU of that model of its own choosing, and the one it answers is the
resource's device from then on: kept in memory at once (``PickState``) and recorded in
status.fabricDeviceID. Every read of the resource's device (attach daemon, detach) goes
through ``read_device``, and so does the detach, by the recorded id.

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
from typing import TYPE_CHECKING, Any

from api.v1alpha1 import API_VERSION, ComposableResourceSpec
from composable_dra.fabric.backend import (
    Device,
    DevicePicker,
    FabricBackend,
    FabricError,
    Operation,
    TransientError,
    picker,
)
from composable_dra.fabric.slots import is_slot, recover_pick
from composable_dra.k8s.kube import path
from composable_dra.process import logs
from composable_operator.reconcile import REQUEST_SETTLE_SECONDS, AttachRecord, parse_attach_record

if TYPE_CHECKING:
    from composable_operator.controller import AttachCall, Controller

log = logs.get(__name__)


@dataclass
class PickState:
    """This process's picks (resource uid -> the fabric's device id), ahead of the status
    watch, and one lock per (fabric, host) that serialises attaches and recoveries."""

    picked: dict[str, str] = field(default_factory=dict)
    locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def lock(self, fabric: str, host: str) -> asyncio.Lock:
        return self.locks.setdefault((fabric, host), asyncio.Lock())


def picks_for(backend: FabricBackend, spec: ComposableResourceSpec) -> DevicePicker | None:
    """The backend as a picker when this resource is a slot on a fabric that picks."""
    p = picker(backend)
    return p if p is not None and is_slot(spec.device_id) else None


def recorded_pick(ctl: Controller, uid: str, status: Mapping[str, Any]) -> str | None:
    return ctl.picks.picked.get(uid) or (str(status.get("fabricDeviceID") or "") or None)


def slot_device(spec: ComposableResourceSpec, state: str) -> Device:
    """The slot as a device: free (attach it), or busy (an attach may be landing)."""
    return Device(
        id=spec.device_id,
        model=spec.model or "",
        zone="",
        uuid="",
        state="busy" if state == "busy" else "free",
    )


def record_pick(ctl: Controller, uid: str, name: str, device_id: str) -> None:
    ctl.picks.picked[uid] = device_id
    # After any earlier write of the record, in order; the memory copy serves meanwhile.
    ctl.record_attach(uid, name, None, {"fabricDeviceID": device_id})


def others_recorded(ctl: Controller, fabric: str, uid: str) -> set[str]:
    """Device ids that other resources of the fabric hold: what a recovery must not take.

    This process's picks (ahead of the status writes) of resources that still exist, and
    what the API server shows, less the records of resources being deleted: a device new
    on the host since our request cannot be one that such a resource still holds (it
    would have been there before), and the record of one whose detach just ended is
    stale. (A pick of this process for a resource being deleted counts until it is gone.)
    """
    items = ctl.kube.get(path(API_VERSION, "composableresources"))["items"]
    present = {
        str(r["metadata"].get("uid")): r
        for r in items
        if (r.get("spec") or {}).get("fabric") == fabric and r["metadata"].get("uid") != uid
    }
    held = {i for other, i in ctl.picks.picked.items() if other in present}
    for r in present.values():
        if r["metadata"].get("deletionTimestamp"):
            continue
        held.add(str(r["spec"].get("deviceID", "")))
        if picked := (r.get("status") or {}).get("fabricDeviceID"):
            held.add(str(picked))
    return held


async def recover(
    ctl: Controller,
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
    others = await asyncio.to_thread(others_recorded, ctl, spec.fabric, uid)
    return recover_pick(before, now, others, spec.model)


async def read_device(
    ctl: Controller,
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
    if (rid := recorded_pick(ctl, uid, status)) is not None:
        return await asyncio.to_thread(backend.device, rid)  # None: no host has it now
    call: AttachCall | None = ctl.attaches.get(uid)
    if call is not None and call.state() == "running":
        return slot_device(spec, "busy")
    record = parse_attach_record(status)
    if record is None or record.machine_resources is None:
        return slot_device(spec, "free")
    async with ctl.picks.lock(spec.fabric, record.host):
        if (rid := recorded_pick(ctl, uid, status)) is not None:
            return await asyncio.to_thread(backend.device, rid)
        found = await recover(ctl, p, spec, uid, record.host, record.machine_resources)
        if found is not None:
            log.info("lost attach answer recovered", resource=name, device=found.id)
            record_pick(ctl, uid, name, found.id)
            return found
    if time.time() - record.requested_at < REQUEST_SETTLE_SECONDS:
        return slot_device(spec, "busy")
    await ctl.record_attach(uid, name, None, {})  # it can no longer land: start afresh
    return slot_device(spec, "free")


def start_pick(
    ctl: Controller, uid: str, name: str, p: DevicePicker, spec: ComposableResourceSpec, host: str
) -> AttachCall:
    """Ask the fabric for one GPU of the slot's model on the host, and record the one it
    attached (controller.start_attach's counterpart; the same AttachCall bookkeeping)."""
    from composable_operator.controller import AttachCall

    async def run() -> Operation | None:
        if not spec.model:
            raise FabricError(f"slot {spec.device_id} names no model to attach")
        async with ctl.picks.lock(spec.fabric, host):
            before = tuple(d.id for d in await asyncio.to_thread(p.host_devices, host))
            record = AttachRecord(host, time.time(), machine_resources=before)
            # On the API server before the request goes: a restart must find it.
            await ctl.record_attach(uid, name, record, {"phase": "Attaching", "error": None})
            try:
                device = await asyncio.to_thread(p.attach_model, spec.model, host)
            except FabricError as exc:
                found = await recover(ctl, p, spec, uid, host, before)
                if found is None:
                    if not isinstance(exc, TransientError):
                        ctl.record_attach(uid, name, None, {})  # answered: nothing landed
                    raise
                log.info("lost attach answer recovered", resource=name, device=found.id)
                device = found
            record_pick(ctl, uid, name, device.id)
        return None

    call = AttachCall(asyncio.ensure_future(run()))
    ctl.attaches[uid] = call
    return call
