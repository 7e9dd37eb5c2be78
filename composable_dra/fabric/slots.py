"""Pool slots for a fabric that picks the device at attach (backend.DevicePicker).

Such a fabric (the Fsas FM as CoHDI uses it) lists its free GPUs as counts per zone and
model and attaches "one GPU of model M" of its own choosing. Its pools therefore publish
*slots*: interchangeable devices named ``slot-<digest of zone and model>-<n>`` that carry
no identity. A claim allocates a slot; the operator asks the fabric for one GPU of the
model for the node and records the one the fabric answers (status.fabricDeviceID); from
then on everything that touches the GPU uses that record, never the slot name.

Pure functions: the pool publisher's slot view (``with_slots``), and the operator's
recovery of a pick whose answer was lost (``recover_pick``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from composable_dra.fabric.backend import Device, Inventory, Zone

SLOT = "slot-"


def slot_prefix(zone: str, model: str) -> str:
    """What every slot of one zone and model starts with (a DNS label, whatever the ids)."""
    digest = hashlib.sha256(f"{zone}/{model}".encode()).hexdigest()[:10]
    return f"{SLOT}{digest}-"


def slot_name(zone: str, model: str, index: int) -> str:
    return f"{slot_prefix(zone, model)}{index}"


def is_slot(device_id: str) -> bool:
    return device_id.startswith(SLOT)


@dataclass(frozen=True)
class SlotHold:
    """A ComposableResource that names a slot, and the device the fabric gave it."""

    slot: str  # spec.deviceID
    picked: str | None  # status.fabricDeviceID; None while no answer was recorded


def slot_holds(resources: Iterable[dict[str, Any]], fabric: str) -> list[SlotHold]:
    """The slot holds of one fabric's ComposableResources (anything but Detached)."""
    out = []
    for cr in resources:
        spec, status = cr.get("spec") or {}, cr.get("status") or {}
        device = str(spec.get("deviceID", ""))
        if spec.get("fabric") != fabric or not is_slot(device) or status.get("phase") == "Detached":
            continue
        picked = status.get("fabricDeviceID")
        out.append(SlotHold(device, str(picked) if picked else None))
    return out


def with_slots(inv: Inventory, holds: Sequence[SlotHold], allocated: Iterable[str]) -> Inventory:
    """The inventory with its free counts turned into slot devices.

    ``allocated``: the device names that live claim allocations name in this fabric's
    pools. Per zone and model, the slots published are every allocated one (it keeps its
    pool identity until its allocation ends, as any pool device) and as many more as the
    fabric has free GPUs left over: the free count less the slots already spoken for
    whose GPU the fabric has not yet handed out (allocated or held, with no picked device
    attached in this very inventory: it is still in the count). A pick recorded but not
    yet seen attached counts as spoken for too: at worst one slot too few for one pass,
    never one GPU promised twice. New slots take the lowest indices that no resource and
    no allocation names, so a released resource's slot name is never handed out again
    while that resource exists.
    """
    allocated = set(allocated)
    devices = dict(inv.devices)
    zones = dict(inv.zones)
    for (zone, model), free in sorted(inv.free_counts.items()):
        prefix = slot_prefix(zone, model)
        mine = [h for h in holds if h.slot.startswith(prefix)]
        named = {h.slot for h in mine} | {a for a in allocated if a.startswith(prefix)}
        landed = {h.slot for h in mine if h.picked is not None and h.picked in inv.devices}
        spare = max(0, free - len(named - landed))
        slots = sorted(a for a in allocated if a.startswith(prefix))
        index = 0
        while spare > 0:
            name = slot_name(zone, model, index)
            if name not in named:
                slots.append(name)
                spare -= 1
            index += 1
        for name in slots:
            devices[name] = Device(id=name, model=model, zone=zone, uuid="", state="free")
        if zone in zones:
            zones[zone] = replace(zones[zone], devices=zones[zone].devices | frozenset(slots))
        elif slots:
            zones[zone] = Zone(zone, frozenset(), frozenset(slots))
    return replace(inv, devices=devices, zones=zones)


def recover_pick(
    before: Iterable[str], now: Sequence[Device], others: set[str], model: str | None
) -> Device | None:
    """The device an attach whose answer was lost attached, found by what the host has
    now that it did not have before the request (``before``), less what other resources
    record (``others``), of the model asked for. Attaches to one host are made one at a
    time, so at most one such device is ours; any of them would do (they are alike), and
    the lowest id makes the choice the same on every look."""
    had = set(before)
    found = [
        d for d in now if d.id not in had and d.id not in others and (not model or d.model == model)
    ]
    return min(found, key=lambda d: d.id) if found else None
