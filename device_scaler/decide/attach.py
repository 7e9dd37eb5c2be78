"""Phase 1: allocations whose binding conditions are pending.

Every pool allocation of our driver waiting on ``FabricDeviceReady`` gets a
ComposableResource; the claim's status then says ready (Online) or failed (Failed, a failed
fabric operation, the attach timeout), and a failed device is quarantined and its resource
deleted.
"""

from __future__ import annotations

from dataclasses import dataclass

from composable_dra.k8s.conditions import condition
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import parse_time
from composable_dra.model import names
from composable_dra.model.sizing import limits
from device_scaler.decide.actions import (
    Action,
    CreateResource,
    DeleteResource,
    Quarantine,
    SetDeviceStatus,
)
from device_scaler.decide.builders import resource_body, resource_name
from device_scaler.decide.claims import PendingClaim
from device_scaler.decide.reading import (
    fabric_failure,
    is_true,
    meta_of,
    same_entry,
    status_entry,
)
from device_scaler.decide.view import Counts, DecisionView


@dataclass(frozen=True)
class Settled:
    """The claim's entry already says ready or failed: keep it as it is."""

    entry: JSON
    doomed: str | None  # a failed device's resource, to make sure it is gone


@dataclass(frozen=True)
class Create:
    action: CreateResource
    key: tuple[str, str, str]


@dataclass(frozen=True)
class Ready:
    entry: JSON
    since: float | None  # seconds since the allocation


@dataclass(frozen=True)
class Failed:
    reason: str
    message: str


Step = Settled | Create | Ready | Failed | None  # None: nothing to do yet


def settled(observed: JSON | None, pc: PendingClaim, pool: str, device: str) -> Settled | None:
    conds = (observed or {}).get("conditions") or []
    if observed is None or not (
        is_true(conds, names.FABRIC_DEVICE_READY)
        or any(
            is_true(conds, c) for c in (names.FABRIC_DEVICE_FAILED, names.FABRIC_DEVICE_RESCHEDULE)
        )
    ):
        return None
    # Failed earlier: make sure its resource is gone (a crash may have come between the
    # status write and the delete).
    doomed = None
    if not is_true(conds, names.FABRIC_DEVICE_READY):
        doomed = resource_name(pc.ref.uid, pool, device)
    keep = ("driver", "pool", "device", "conditions", "data")
    return Settled({k: observed[k] for k in keep if k in observed}, doomed)


def new_resource(
    view: DecisionView, counts: Counts, pc: PendingClaim, pool: str, device: str
) -> Step:
    """No resource yet for this allocated device: create one, unless that cannot work."""
    if pc.deleting:
        return None
    attrs = (view.s.pool_devices.get((pool, device)) or {}).get("attributes") or {}
    fabric = str((attrs.get("fabric") or {}).get("string") or pool.split("/", 1)[0])
    block = str((attrs.get("blockID") or {}).get("string") or device)
    model = str((attrs.get("model") or {}).get("string") or "")
    held_by = view.holders.get((fabric, block))
    if pc.node is None:
        return Failed("NoNode", "the allocation names no single node")
    if held_by is not None:
        # Never two resources for one block: the scheduler saw it free in the moment
        # between an allocation ending and the pool dropping it.
        return Failed("DeviceInUse", f"{block} is held by ComposableResource {held_by}")
    lim = limits(view.s.requests, fabric, model, pc.node)
    if lim.max_size is not None and counts.count(fabric, pc.node, model) >= lim.max_size:
        return Failed("MaxSizeReached", f"{pc.node} already has {lim.max_size} x {model}")
    name = resource_name(pc.ref.uid, pool, device)
    body = resource_body(name, pc.ref, pool, device, fabric, block, model, pc.node)
    return Create(CreateResource(name, body, pc.ref, device), (fabric, pc.node, model))


def attach_progress(view: DecisionView, cr: JSON, pc: PendingClaim, pool: str, device: str) -> Step:
    """The resource exists: is its device ready, failed, or still attaching?"""
    s, cfg = view.s, view.cfg
    status = cr.get("status") or {}
    phase = status.get("phase")
    created = parse_time(meta_of(cr).get("creationTimestamp")) or s.now
    fabric_error = fabric_failure(cr) if cfg.fail_on_fabric_error else None
    if meta_of(cr).get("deletionTimestamp"):
        return Failed("ResourceDeleted", "the ComposableResource was deleted before it was online")
    if phase == "Online" and status.get("deviceUUID"):
        spec = view.specs.get(meta_of(cr)["name"])
        node = spec.target_node if spec is not None else None
        message = f"attached to {node} as {status['deviceUUID']}"
        entry = {
            "driver": cfg.driver,
            "pool": pool,
            "device": device,
            "conditions": [condition(names.FABRIC_DEVICE_READY, True, "Attached", message, s.now)],
            "data": {"uuid": status["deviceUUID"]},
        }
        return Ready(entry, s.now - pc.allocated_at if pc.allocated_at else None)
    if phase == "Failed":
        return Failed("AttachFailed", str(status.get("error") or "the attach failed"))
    if fabric_error is not None:
        return Failed("FabricOperationFailed", fabric_error)
    if s.now - created > cfg.attach_timeout:
        return Failed("AttachTimeout", f"not online after {cfg.attach_timeout:.0f}s")
    return None  # still attaching


def result_step(view: DecisionView, counts: Counts, pc: PendingClaim, result: JSON) -> Step:
    pool, device = str(result.get("pool")), str(result.get("device"))
    done = settled(status_entry(pc.claim, view.cfg.driver, pool, device), pc, pool, device)
    if done is not None:
        return done
    found = view.resources.get(resource_name(pc.ref.uid, pool, device))
    if found is None:
        return new_resource(view, counts, pc, pool, device)
    return attach_progress(view, found, pc, pool, device)


def claim_actions(
    view: DecisionView, counts: Counts, pc: PendingClaim
) -> tuple[list[Action], Counts]:
    """One claim: resources to create, its status entries, quarantines and deletes."""
    actions: list[Action] = []
    entries: list[JSON] = []
    changed = False
    ready: list[tuple[str, float | None]] = []
    failed: list[tuple[str, str, str]] = []
    doomed: list[tuple[str, str, str]] = []  # resources to delete after the status write
    for r in pc.results:
        pool, device = str(r.get("pool")), str(r.get("device"))
        step = result_step(view, counts, pc, r)
        if isinstance(step, Settled):
            entries.append(step.entry)
            if step.doomed is not None:
                doomed.append((step.doomed, "AttachFailed", ""))
            continue
        if isinstance(step, Create):
            actions.append(step.action)
            counts = counts.add(step.key)
            continue
        if step is None:
            continue
        if isinstance(step, Ready):
            entry = step.entry
            ready.append((device, step.since))
        else:
            conds = [
                condition(names.FABRIC_DEVICE_FAILED, True, step.reason, step.message, view.s.now)
            ]
            entry = {"driver": view.cfg.driver, "pool": pool, "device": device, "conditions": conds}
            failed.append((device, step.reason, step.message))
            doomed.append((resource_name(pc.ref.uid, pool, device), step.reason, step.message))
            actions.append(Quarantine(pool, device, view.s.now + view.cfg.quarantine))
        entries.append(entry)
        observed = status_entry(pc.claim, view.cfg.driver, pool, device)
        changed = changed or not same_entry(observed, entry)
    if changed:
        version = str(meta_of(pc.claim).get("resourceVersion") or "")
        actions.append(SetDeviceStatus(pc.ref, entries, ready, failed, version))
    for name, reason, message in doomed:
        if name in view.resources and not meta_of(view.resources[name]).get("deletionTimestamp"):
            actions.append(DeleteResource(name, reason, message))
    return actions, counts


def pending_allocations(view: DecisionView, counts: Counts) -> tuple[list[Action], Counts]:
    actions: list[Action] = []
    for facts in view.claims:
        if facts.pending is not None:
            more, counts = claim_actions(view, counts, facts.pending)
            actions.extend(more)
    return actions, counts
