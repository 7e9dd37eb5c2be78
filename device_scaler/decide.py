"""The Dynamic Device Scaler's decisions, as one pure function of what it observes.

``decide(snapshot, settings)`` returns the actions that move the cluster toward:

- every pool allocation of our driver whose binding conditions are pending has a
  ComposableResource (claim reference, node from the allocation's nodeSelector);
- a resource that is Online gives its claim ``FabricDeviceReady=True`` with the device UUID
  in the status ``data``; one that Failed, reports a failed fabric operation, or takes longer
  than the attach timeout gives ``FabricDeviceFailed=True``, a short NoSchedule quarantine of
  that pool device (so the scheduler's retry picks another block), and is deleted;
- once the allocation ends, an Online resource is *released*: its claimRef is cleared, so the
  node's plugin publishes the GPU as an idle local device (after the pool publisher dropped it
  from the pool: published exactly once), and its idle window starts;
- idle GPUs (released, not allocated as local devices) are detached after the no-removal
  window, least recently used first, never below a ComposabilityRequest's minSize for that
  node and model; above its maxSize idle ones go first, window or not.

Timestamps are seconds since the epoch; objects are plain dicts as the API server sends them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.v1alpha1 import API_VERSION, ClaimRef, ComposableResourceSpec
from composable_dra.k8s.conditions import condition
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import format_time, parse_time
from composable_dra.model import names
from composable_dra.model.names import (
    ANN_ADOPTED,
    ANN_EXPIRES,
    ANN_IN_USE_BY,
    ANN_POOL,
    ANN_POOL_DEVICE,
    QUARANTINE_LABEL,
    normalize_uuid,
)
from composable_dra.model.sizing import (
    ANN_LAST_USED as ANN_LAST_USED,
)
from composable_dra.model.sizing import (
    last_used,
    least_recently_used,
    limits,
    spec_of,
)
from device_scaler import standby as sb

MANAGED_LABEL = f"{names.PREFIX}/managed-by"
MANAGED_VALUE = "scaler"


# -- time --------------------------------------------------------------------------------


# -- names -------------------------------------------------------------------------------


def resource_name(claim_uid: str, pool: str, device: str) -> str:
    """The ComposableResource of one allocated pool device: deterministic, so a restart or
    a duplicate event finds the one already created instead of making another."""
    digest = hashlib.sha256(f"{claim_uid}/{pool}/{device}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^a-z0-9-]+", "-", device.lower()).strip("-")[:40].strip("-") or "dev"
    return f"{stem}-{digest}"


def quarantine_rule_name(pool: str, device: str) -> str:
    digest = hashlib.sha256(f"{pool}/{device}".encode()).hexdigest()[:12]
    return f"quarantine-{digest}"


# -- observations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    driver: str = names.DRIVER
    attach_timeout: float = 300.0
    no_removal: float = 600.0
    quarantine: float = 60.0
    fail_on_fabric_error: bool = True


@dataclass(frozen=True)
class Snapshot:
    now: float
    claims: list[JSON]
    resources: list[JSON]
    # (pool, device) -> the device entry, for every device of our driver's fabric pools.
    pool_devices: Mapping[tuple[str, str], JSON]
    # (node, normalized uuid) -> local device name, from the nodes' own slices.
    local_devices: Mapping[tuple[str, str], str]
    requests: list[JSON] = field(default_factory=list)
    quarantines: list[JSON] = field(default_factory=list)
    standby: sb.StandbyInputs = field(default_factory=sb.StandbyInputs)


# -- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateResource:
    name: str
    body: JSON
    claim: ClaimRef | None  # None: a warm standby GPU
    device: str


@dataclass(frozen=True)
class SetDeviceStatus:
    claim: ClaimRef
    entries: list[JSON]
    ready: list[tuple[str, float | None]] = field(default_factory=list)  # device, since alloc
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # device, reason, message


@dataclass(frozen=True)
class DeleteResource:
    name: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class PatchResource:
    """A metadata/spec merge patch of a resource the scaler owns."""

    name: str
    patch: JSON
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Quarantine:
    pool: str
    device: str
    until: float


@dataclass(frozen=True)
class Unquarantine:
    rule: str


Action = (
    CreateResource | SetDeviceStatus | DeleteResource | PatchResource | Quarantine | Unquarantine
)


# -- helpers -----------------------------------------------------------------------------


def _meta(obj: JSON) -> JSON:
    meta: JSON = obj.get("metadata") or {}
    return meta


def allocation_node(allocation: JSON) -> str | None:
    """The node of a bindsToNode allocation, from its nodeSelector."""
    selector = allocation.get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                values = req.get("values") or []
                if len(values) == 1:
                    return str(values[0])
        for req in term.get("matchExpressions") or []:
            if req.get("key") == "kubernetes.io/hostname" and req.get("operator") == "In":
                values = req.get("values") or []
                if len(values) == 1:
                    return str(values[0])
    return None


def is_fabric_pool(pool: str, node_names: Iterable[str] = ()) -> bool:
    return "/" in pool and pool not in set(node_names)


def _condition(conds: Iterable[JSON], kind: str) -> JSON | None:
    return next((c for c in conds if c.get("type") == kind), None)


def _true(conds: Iterable[JSON], kind: str) -> bool:
    c = _condition(conds, kind)
    return c is not None and c.get("status") == "True"


def status_entry(claim: JSON, driver: str, pool: str, device: str) -> JSON | None:
    for st in (claim.get("status") or {}).get("devices") or []:
        if (st.get("driver"), st.get("pool"), st.get("device")) == (driver, pool, device):
            entry: JSON = st
            return entry
    return None


def _same_entry(a: JSON | None, b: JSON) -> bool:
    if a is None:
        return False

    def key(e: JSON) -> Any:
        return (
            sorted((c.get("type"), c.get("status")) for c in e.get("conditions") or []),
            e.get("data") or {},
        )

    return bool(key(a) == key(b))


def our_results(claim: JSON, driver: str) -> list[JSON]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        r
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == driver
    ]


def managed(cr: JSON) -> bool:
    """Resources whose release and idle detach are the scaler's: those it created, and
    orphans the operator adopted (one owner for the idle rule)."""
    meta = _meta(cr)
    return (meta.get("labels") or {}).get(MANAGED_LABEL) == MANAGED_VALUE or (
        meta.get("annotations") or {}
    ).get(ANN_ADOPTED) == "adopt"


def _fabric_failure(cr: JSON) -> str | None:
    """The operator's report of a fabric operation that ran and failed, if any."""
    status = cr.get("status") or {}
    attached = _condition(status.get("conditions") or [], names.ATTACHED)
    if attached and attached.get("status") == "False" and attached.get("reason") == "FabricFailed":
        return str(attached.get("message") or status.get("error") or "fabric operation failed")
    return None


def _live(cr: JSON) -> bool:
    return not _meta(cr).get("deletionTimestamp") and (cr.get("status") or {}).get("phase") in (
        None,
        "Attaching",
        "Online",
    )


# -- the decision: small phases over one read-only view -------------------------------------


@dataclass(frozen=True)
class Counts:
    """Live resources by (fabric, node, model): what a request's min and max are checked
    against. A value: ``add`` returns a new one, so each phase says what it changed."""

    by_key: Mapping[tuple[str, str, str], int] = field(default_factory=dict)

    def count(self, fabric: str, node: str | None, model: str) -> int:
        """On one node, or cluster-wide when node is None."""
        return sum(
            n
            for (f, nd, m), n in self.by_key.items()
            if f == fabric and m == model and node in (None, nd)
        )

    def add(self, key: tuple[str, str, str], delta: int = 1) -> Counts:
        return Counts({**self.by_key, key: self.by_key.get(key, 0) + delta})


def _key(spec: ComposableResourceSpec) -> tuple[str, str, str]:
    return (spec.fabric, spec.target_node, spec.model or "")


def live_counts(resources: Iterable[JSON], specs: Mapping[str, ComposableResourceSpec]) -> Counts:
    counts: dict[tuple[str, str, str], int] = {}
    for cr in resources:
        spec = specs.get(_meta(cr)["name"])
        if spec is not None and _live(cr):
            counts[_key(spec)] = counts.get(_key(spec), 0) + 1
    return Counts(counts)


def block_holders(
    resources: Iterable[JSON], specs: Mapping[str, ComposableResourceSpec]
) -> dict[tuple[str, str], str]:
    """(fabric, block) -> the resource that holds it (any not Detached)."""
    holders = {}
    for cr in resources:
        spec = specs.get(_meta(cr)["name"])
        if spec is not None and (cr.get("status") or {}).get("phase") != "Detached":
            holders[(spec.fabric, spec.device_id)] = _meta(cr)["name"]
    return holders


@dataclass(frozen=True)
class View:
    """What every phase reads: the snapshot, indexed once."""

    s: Snapshot
    cfg: Settings
    resources: Mapping[str, JSON]
    specs: Mapping[str, ComposableResourceSpec]
    holders: Mapping[tuple[str, str], str]


def index(s: Snapshot, cfg: Settings) -> View:
    resources = {_meta(cr)["name"]: cr for cr in s.resources}
    specs = {n: spec for n, cr in resources.items() if (spec := spec_of(cr)) is not None}
    return View(s, cfg, resources, specs, block_holders(s.resources, specs))


# 1. Allocations whose binding conditions are pending.


@dataclass(frozen=True)
class PendingClaim:
    """A claim with pool devices of ours waiting on FabricDeviceReady."""

    claim: JSON
    ref: ClaimRef
    node: str | None  # the allocation's node
    deleting: bool
    allocated_at: float | None
    results: list[JSON]  # our allocation results that wait on FabricDeviceReady


def pending_claim(claim: JSON, driver: str) -> PendingClaim | None:
    meta = _meta(claim)
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    # Fabric pool devices only: a remote-lease device (RemoteGPUReady) is a donor's.
    ours = [
        r
        for r in our_results(claim, driver)
        if names.FABRIC_DEVICE_READY in (r.get("bindingConditions") or [])
    ]
    if not ours:
        return None
    return PendingClaim(
        claim,
        ClaimRef(meta.get("namespace", ""), meta["name"], meta.get("uid", "")),
        allocation_node(allocation),
        bool(meta.get("deletionTimestamp")),
        parse_time(allocation.get("allocationTimestamp")),
        ours,
    )


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
        _true(conds, names.FABRIC_DEVICE_READY)
        or any(
            _true(conds, c) for c in (names.FABRIC_DEVICE_FAILED, names.FABRIC_DEVICE_RESCHEDULE)
        )
    ):
        return None
    # Failed earlier: make sure its resource is gone (a crash may have come between the
    # status write and the delete).
    doomed = None
    if not _true(conds, names.FABRIC_DEVICE_READY):
        doomed = resource_name(pc.ref.uid, pool, device)
    keep = ("driver", "pool", "device", "conditions", "data")
    return Settled({k: observed[k] for k in keep if k in observed}, doomed)


def new_resource(view: View, counts: Counts, pc: PendingClaim, pool: str, device: str) -> Step:
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


def attach_progress(view: View, cr: JSON, pc: PendingClaim, pool: str, device: str) -> Step:
    """The resource exists: is its device ready, failed, or still attaching?"""
    s, cfg = view.s, view.cfg
    status = cr.get("status") or {}
    phase = status.get("phase")
    created = parse_time(_meta(cr).get("creationTimestamp")) or s.now
    fabric_error = _fabric_failure(cr) if cfg.fail_on_fabric_error else None
    if _meta(cr).get("deletionTimestamp"):
        return Failed("ResourceDeleted", "the ComposableResource was deleted before it was online")
    if phase == "Online" and status.get("deviceUUID"):
        spec = view.specs.get(_meta(cr)["name"])
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


def result_step(view: View, counts: Counts, pc: PendingClaim, result: JSON) -> Step:
    pool, device = str(result.get("pool")), str(result.get("device"))
    done = settled(status_entry(pc.claim, view.cfg.driver, pool, device), pc, pool, device)
    if done is not None:
        return done
    found = view.resources.get(resource_name(pc.ref.uid, pool, device))
    if found is None:
        return new_resource(view, counts, pc, pool, device)
    return attach_progress(view, found, pc, pool, device)


def claim_actions(view: View, counts: Counts, pc: PendingClaim) -> tuple[list[Action], Counts]:
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
        changed = changed or not _same_entry(observed, entry)
    if changed:
        actions.append(SetDeviceStatus(pc.ref, entries, ready, failed))
    for name, reason, message in doomed:
        if name in view.resources and not _meta(view.resources[name]).get("deletionTimestamp"):
            actions.append(DeleteResource(name, reason, message))
    return actions, counts


def pending_allocations(view: View, counts: Counts) -> tuple[list[Action], Counts]:
    actions: list[Action] = []
    for claim in view.s.claims:
        pc = pending_claim(claim, view.cfg.driver)
        if pc is not None:
            more, counts = claim_actions(view, counts, pc)
            actions.extend(more)
    return actions, counts


# 2. Resources whose allocation ended: release (Online) or clean up (never online).


def allocation_ended(
    view: View, cr: JSON, ref: ClaimRef, claims_by_uid: Mapping[str, JSON]
) -> Action | None:
    """A resource made for a claim: None while that allocation lasts."""
    meta = _meta(cr)
    ann = meta.get("annotations") or {}
    pool, device = ann.get(ANN_POOL, ""), ann.get(ANN_POOL_DEVICE, "")
    holder = claims_by_uid.get(ref.uid)
    if holder is not None and any(
        (r.get("pool"), r.get("device")) == (pool, device)
        for r in our_results(holder, view.cfg.driver)
    ):
        return None
    if (cr.get("status") or {}).get("phase") != "Online":
        # Never online for this allocation (failed, or the claim went away mid-attach).
        return DeleteResource(
            meta["name"], "AllocationEnded", "the allocation ended before the GPU was online"
        )
    if (pool, device) in view.s.pool_devices:
        return None  # the pool publisher drops it first: published exactly once
    return PatchResource(
        meta["name"],
        {
            "metadata": {
                "annotations": {ANN_LAST_USED: format_time(view.s.now), ANN_IN_USE_BY: None}
            },
            "spec": {"claimRef": None},
        },
        "Released",
        f"claim {ref.namespace}/{ref.name} released the GPU; it stays attached as an idle "
        "local device",
    )


# 3. Idle bookkeeping: is a released GPU allocated again, as a local device?


@dataclass(frozen=True)
class IdleGPU:
    last_used: float
    cr: JSON
    spec: ComposableResourceSpec


def local_users(claims: Iterable[JSON], driver: str) -> dict[tuple[str, str], str]:
    """(pool, device) -> the uid of the first claim whose allocation names it."""
    users: dict[tuple[str, str], str] = {}
    for claim in claims:
        for r in our_results(claim, driver):
            users.setdefault(
                (str(r.get("pool")), str(r.get("device"))), str(_meta(claim).get("uid") or "")
            )
    return users


def idle_bookkeeping(
    view: View, cr: JSON, spec: ComposableResourceSpec, users: Mapping[tuple[str, str], str]
) -> Action | IdleGPU | None:
    """A released, Online GPU: mark it in use or idle again, or count it idle."""
    meta, status = _meta(cr), cr.get("status") or {}
    ann = meta.get("annotations") or {}
    node = spec.target_node
    local = view.s.local_devices.get((node, normalize_uuid(str(status.get("deviceUUID") or ""))))
    user = users.get((node, local)) if local is not None else None
    if user:
        if ann.get(ANN_IN_USE_BY) == user:
            return None
        return PatchResource(
            meta["name"],
            {"metadata": {"annotations": {ANN_IN_USE_BY: user}}},
            "InUse",
            f"allocated as local device {local}",
        )
    if ann.get(ANN_IN_USE_BY):
        stamp = {ANN_IN_USE_BY: None, ANN_LAST_USED: format_time(view.s.now)}
        return PatchResource(
            meta["name"],
            {"metadata": {"annotations": stamp}},
            "Idle",
            "no allocation uses the GPU any more",
        )
    return IdleGPU(last_used(cr, view.s.now), cr, spec)


def ended_allocations(view: View) -> tuple[list[Action], list[IdleGPU]]:
    claims_by_uid = {str(_meta(c).get("uid")): c for c in view.s.claims}
    users = local_users(view.s.claims, view.cfg.driver)
    actions: list[Action] = []
    idle: list[IdleGPU] = []
    for cr in view.s.resources:
        spec = view.specs.get(_meta(cr)["name"])
        if spec is None or not managed(cr) or _meta(cr).get("deletionTimestamp"):
            continue
        if spec.claim_ref is not None:
            ref = ClaimRef(spec.claim_ref.namespace, spec.claim_ref.name, spec.claim_ref.uid)
            if (action := allocation_ended(view, cr, ref, claims_by_uid)) is not None:
                actions.append(action)
            continue
        if (cr.get("status") or {}).get("phase") != "Online":
            continue
        step = idle_bookkeeping(view, cr, spec, users)
        if isinstance(step, IdleGPU):
            idle.append(step)
        elif step is not None:
            actions.append(step)
    return actions, idle


# 4. Idle scale-down: least recently used first, honouring min/max.


def scale_down(
    view: View, counts: Counts, idle: list[IdleGPU], keep: frozenset[str] = frozenset()
) -> list[Action]:
    """``keep``: idle GPUs a warm standby holds (phase 4b), left alone."""
    actions: list[Action] = []
    by_name = {_meta(i.cr)["name"]: i for i in idle if _meta(i.cr)["name"] not in keep}
    for cr in least_recently_used((i.cr for i in by_name.values()), view.s.now):
        gpu = by_name[_meta(cr)["name"]]
        fabric, node, model = _key(gpu.spec)
        node_lim = limits(view.s.requests, fabric, model, node)
        cluster_lim = limits(view.s.requests, fabric, model, None)
        n_node, n_all = counts.count(fabric, node, model), counts.count(fabric, None, model)
        over = (node_lim.max_size is not None and n_node > node_lim.max_size) or (
            cluster_lim.max_size is not None and n_all > cluster_lim.max_size
        )
        expired = view.s.now - gpu.last_used >= view.cfg.no_removal
        if not (over or expired):
            continue
        if n_node - 1 < node_lim.min_size or n_all - 1 < cluster_lim.min_size:
            continue
        reason = "IdleTimeout" if expired else "OverMaxSize"
        message = f"idle since {format_time(gpu.last_used)}; detaching"
        actions.append(DeleteResource(_meta(cr)["name"], reason, message))
        counts = counts.add((fabric, node, model), -1)
    return actions


# 4b. Warm standby (device_scaler/standby.py): idle GPUs kept attached in each zone.


def _returned(gpu: IdleGPU, actions: Iterable[Action]) -> bool:
    return any(isinstance(a, DeleteResource) and a.name == _meta(gpu.cr)["name"] for a in actions)


def standby_free_blocks(view: View, users: set[tuple[str, str]]) -> list[sb.FreeBlock]:
    """The pool blocks standby may take: not allocated, quarantined, tainted or held."""
    s = view.s
    taken = users | {
        (str(sel.get("pool")), str(sel.get("device")))
        for rule in s.quarantines
        if (sel := (rule.get("spec") or {}).get("deviceSelector") or {})
    }
    free: list[sb.FreeBlock] = []
    for (pool, device), dev in s.pool_devices.items():
        attrs = dev.get("attributes") or {}
        block = str((attrs.get("blockID") or {}).get("string") or device)
        if (pool, device) in taken or dev.get("taints"):
            continue
        if (pool.split("/", 1)[0], block) in view.holders:
            continue
        model = str((attrs.get("model") or {}).get("string") or "")
        free.append(sb.FreeBlock(pool, device, block, model))
    return free


def _held_idle(idle: list[IdleGPU]) -> list[sb.Held]:
    """The idle GPUs taken from a pool, as the standby plan sees them."""
    return [
        sb.Held(
            _meta(i.cr)["name"],
            pool,
            i.spec.target_node,
            i.spec.model or "",
            i.last_used,
            sb.STANDBY_LABEL in (_meta(i.cr).get("labels") or {}),
            False,
        )
        for i in idle
        if (pool := (_meta(i.cr).get("annotations") or {}).get(ANN_POOL))
    ]


def standby_phase(
    view: View, counts: Counts, idle: list[IdleGPU]
) -> tuple[list[Action], frozenset[str], Counts]:
    """Standby GPUs to attach or return, and the idle GPUs the idle rule must keep."""
    s = view.s
    if not s.standby.zones:
        return [], frozenset(), counts
    actions: list[Action] = []
    held = _held_idle(idle)
    users = local_users(s.claims, view.cfg.driver)
    used = False  # a standby GPU serves a claim since the last pass
    for name, cr in view.resources.items():
        spec = view.specs.get(name)
        if spec is None or sb.STANDBY_LABEL not in (_meta(cr).get("labels") or {}):
            continue
        if spec.claim_ref is not None or _meta(cr).get("deletionTimestamp"):
            continue
        phase = (cr.get("status") or {}).get("phase")
        uuid = normalize_uuid(str((cr.get("status") or {}).get("deviceUUID") or ""))
        local = s.local_devices.get((spec.target_node, uuid)) if uuid else None
        if (_meta(cr).get("annotations") or {}).get(ANN_IN_USE_BY) or (
            local is not None and (spec.target_node, local) in users
        ):
            # Serving a claim, it is an ordinary GPU from now on (released under the idle
            # rule): the label counts only the idle GPUs the standby holds.
            message = "serves a claim; no longer a standby GPU"
            patch = {"metadata": {"labels": {sb.STANDBY_LABEL: None}}}
            actions.append(PatchResource(name, patch, "StandbyUsed", message))
            used = True
            continue
        created = parse_time(_meta(cr).get("creationTimestamp")) or s.now
        trouble = _fabric_failure(cr) or (
            f"not online after {view.cfg.attach_timeout:.0f}s"
            if phase != "Online" and s.now - created > view.cfg.attach_timeout
            else None
        )
        if phase == "Failed" or trouble is not None:
            # Quarantined like a claim's failed block, so the next pass picks another.
            ann = _meta(cr).get("annotations") or {}
            if ann.get(ANN_POOL) and ann.get(ANN_POOL_DEVICE):
                until = s.now + view.cfg.quarantine
                actions.append(Quarantine(ann[ANN_POOL], ann[ANN_POOL_DEVICE], until))
            actions.append(DeleteResource(name, "StandbyFailed", trouble or "the attach failed"))
            counts = counts.add(_key(spec), -1)
        elif phase in (None, "Attaching"):
            pool = (_meta(cr).get("annotations") or {}).get(ANN_POOL, "")
            held.append(sb.Held(name, pool, spec.target_node, spec.model or "", s.now, True, True))
    free = standby_free_blocks(view, set(users))

    def fits(fabric: str, node: str, model: str) -> bool:
        lim = limits(s.requests, fabric, model, node)
        return lim.max_size is None or counts.count(fabric, node, model) < lim.max_size

    plan = sb.plan(s.standby, held, free, s.now, fits)
    for name in plan.surplus:
        actions.append(
            DeleteResource(name, "StandbySurplus", "more standby GPUs idle than maxPerZone")
        )
        spec = view.specs[name]
        counts = counts.add(_key(spec), -1)
    # A replacement for a GPU just used waits a pass: its label goes first, so the labelled
    # idle GPUs never outnumber K, not even for a moment.
    for new in [] if used else plan.create:
        key = (new.fabric, new.node, new.block.model)
        if not fits(*key):
            continue
        body = standby_body(new)
        actions.append(CreateResource(new.name, body, None, new.block.device))
        counts = counts.add(key)
    return actions, plan.keep, counts


# 5. Quarantines that ran out.


def expired_quarantines(rules: Iterable[JSON], now: float) -> list[Action]:
    out: list[Action] = []
    for rule in rules:
        expires = parse_time((_meta(rule).get("annotations") or {}).get(ANN_EXPIRES))
        if expires is None or expires <= now:
            out.append(Unquarantine(_meta(rule)["name"]))
    return out


def decide(s: Snapshot, cfg: Settings) -> list[Action]:
    """The phases in order; a later one sees the counts an earlier one changed."""
    view = index(s, cfg)
    counts = live_counts(s.resources, view.specs)
    attach, counts = pending_allocations(view, counts)
    released, idle = ended_allocations(view)
    warm, keep, counts = standby_phase(view, counts, idle)
    return [
        *attach,
        *released,
        *warm,
        *scale_down(view, counts, [i for i in idle if not _returned(i, warm)], keep),
        *expired_quarantines(s.quarantines, s.now),
    ]


def resource_body(
    name: str,
    claim: ClaimRef,
    pool: str,
    device: str,
    fabric: str,
    block: str,
    model: str,
    node: str,
) -> JSON:
    """The resource of a claim's pool device. It carries the operator's finalizer from
    the start: the operator sends no attach before it is on, and kopf adding it was a
    write and a watch round trip on every attach's path (docs/attach-flow.md, Timing)."""
    spec = ComposableResourceSpec(
        fabric=fabric,
        device_id=block,
        target_node=node,
        model=model or None,
        claim_ref=ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid),
    ).model_dump(by_alias=True, exclude_defaults=True)
    return {
        "apiVersion": API_VERSION,
        "kind": "ComposableResource",
        "metadata": {
            "name": name,
            "labels": {
                MANAGED_LABEL: MANAGED_VALUE,
                names.LABEL_CLAIM_UID: claim.uid,
                names.LABEL_NODE: node[:63],
            },
            "annotations": {ANN_POOL: pool, ANN_POOL_DEVICE: device},
            "finalizers": [names.FINALIZER],
        },
        "spec": spec,
    }


def standby_body(new: sb.NewStandby) -> JSON:
    """A standby GPU's resource: no claim; the node's plugin publishes the GPU as an idle
    local device once it is Online, and the idle rule returns it like any other."""
    spec = ComposableResourceSpec(
        fabric=new.fabric,
        device_id=new.block.block,
        target_node=new.node,
        model=new.block.model or None,
    ).model_dump(by_alias=True, exclude_defaults=True)
    return {
        "apiVersion": API_VERSION,
        "kind": "ComposableResource",
        "metadata": {
            "name": new.name,
            "labels": {
                MANAGED_LABEL: MANAGED_VALUE,
                sb.STANDBY_LABEL: "true",
                names.LABEL_NODE: new.node[:63],
            },
            "annotations": {ANN_POOL: new.block.pool, ANN_POOL_DEVICE: new.block.device},
            "finalizers": [names.FINALIZER],
        },
        "spec": spec,
    }


def quarantine_body(q: Quarantine, driver: str) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": quarantine_rule_name(q.pool, q.device),
            "labels": {QUARANTINE_LABEL: "scaler"},
            "annotations": {ANN_EXPIRES: format_time(q.until)},
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": q.pool, "device": q.device},
            "taint": {
                "key": f"{names.PREFIX}/attach-failed",
                "value": "quarantine",
                "effect": "NoSchedule",
            },
        },
    }
