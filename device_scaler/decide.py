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

from api.v1alpha1 import ClaimRef
from composable_dra import names
from composable_dra.conditions import condition
from composable_dra.kube import JSON
from composable_dra.names import normalize_uuid
from composable_dra.timestamps import format_time, parse_time

MANAGED_LABEL = f"{names.PREFIX}/managed-by"
MANAGED_VALUE = "scaler"
ANN_POOL = f"{names.PREFIX}/pool"
ANN_POOL_DEVICE = f"{names.PREFIX}/pool-device"
ANN_LAST_USED = f"{names.PREFIX}/last-used"
ANN_IN_USE_BY = f"{names.PREFIX}/in-use-by"
ANN_EXPIRES = f"{names.PREFIX}/expires-at"
# Set by the operator on the resources it creates for orphans (composable_operator
# fabric_status.ADOPTED); "adopt": kept, and idle like any GPU the scaler attached.
ANN_ADOPTED = f"{names.PREFIX}/adopted"
QUARANTINE_LABEL = f"{names.PREFIX}/quarantine"
API_VERSION = "composable.dra.io/v1alpha1"


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


# -- actions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateResource:
    name: str
    body: JSON
    claim: ClaimRef
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


@dataclass(frozen=True)
class Limits:
    min_size: int = 0
    max_size: int | None = None


def limits(requests: Iterable[JSON], fabric: str, model: str, node: str | None) -> Limits:
    """min/max of the ComposabilityRequests for a model on a node (node None: cluster-wide)."""
    lo, hi = 0, None
    for req in requests:
        spec = req.get("spec") or {}
        if spec.get("fabric") != fabric or spec.get("model") != model:
            continue
        if spec.get("targetNode") != node:
            continue
        if spec.get("minSize") is not None:
            lo = max(lo, int(spec["minSize"]))
        if spec.get("maxSize") is not None:
            hi = int(spec["maxSize"]) if hi is None else min(hi, int(spec["maxSize"]))
    return Limits(lo, hi)


def _live(cr: JSON) -> bool:
    return not _meta(cr).get("deletionTimestamp") and (cr.get("status") or {}).get("phase") in (
        None,
        "Attaching",
        "Online",
    )


# -- the decision --------------------------------------------------------------------------


def decide(s: Snapshot, cfg: Settings) -> list[Action]:
    actions: list[Action] = []
    resources = {_meta(cr)["name"]: cr for cr in s.resources}
    claims_by_uid = {_meta(c).get("uid"): c for c in s.claims}
    counts: dict[tuple[str, str, str], int] = {}  # (fabric, node, model) -> live resources
    for cr in s.resources:
        if _live(cr):
            spec = cr.get("spec") or {}
            k = (spec.get("fabric", ""), spec.get("targetNode", ""), spec.get("model") or "")
            counts[k] = counts.get(k, 0) + 1

    holders: dict[tuple[str, str], str] = {}  # (fabric, block) -> resource holding it
    for cr in s.resources:
        if (cr.get("status") or {}).get("phase") != "Detached":
            spec = cr.get("spec") or {}
            key = (str(spec.get("fabric", "")), str(spec.get("deviceID", "")))
            holders[key] = _meta(cr)["name"]

    def count(fabric: str, node: str | None, model: str) -> int:
        return sum(
            n
            for (f, nd, m), n in counts.items()
            if f == fabric and m == model and node in (None, nd)
        )

    # 1. Allocations whose binding conditions are pending.
    for claim in s.claims:
        meta = _meta(claim)
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            continue
        ref = ClaimRef(meta.get("namespace", ""), meta["name"], meta.get("uid", ""))
        node = allocation_node(allocation)
        # Fabric pool devices only: a remote-lease device (RemoteGPUReady) is a donor's.
        ours = [
            r
            for r in our_results(claim, cfg.driver)
            if names.FABRIC_DEVICE_READY in (r.get("bindingConditions") or [])
        ]
        if not ours:
            continue
        entries: list[JSON] = []
        changed = False
        ready: list[tuple[str, float | None]] = []
        failed: list[tuple[str, str, str]] = []
        doomed: list[tuple[str, str, str]] = []  # resources to delete after the status write
        allocated_at = parse_time(allocation.get("allocationTimestamp"))
        for r in ours:
            pool, device = str(r.get("pool")), str(r.get("device"))
            observed = status_entry(claim, cfg.driver, pool, device)
            conds = (observed or {}).get("conditions") or []
            if _true(conds, names.FABRIC_DEVICE_READY) or any(
                _true(conds, c)
                for c in (names.FABRIC_DEVICE_FAILED, names.FABRIC_DEVICE_RESCHEDULE)
            ):
                assert observed is not None
                if not _true(conds, names.FABRIC_DEVICE_READY):
                    # Failed earlier; make sure its resource is gone (a crash may have
                    # come between the status write and the delete).
                    doomed.append((resource_name(ref.uid, pool, device), "AttachFailed", ""))
                entries.append(
                    {
                        k: observed[k]
                        for k in ("driver", "pool", "device", "conditions", "data")
                        if k in observed
                    }
                )
                continue
            name = resource_name(ref.uid, pool, device)
            found = resources.get(name)
            fail: tuple[str, str] | None = None
            entry: JSON | None = None
            if found is None:
                pool_dev = s.pool_devices.get((pool, device))
                attrs = (pool_dev or {}).get("attributes") or {}
                fabric = str((attrs.get("fabric") or {}).get("string") or pool.split("/", 1)[0])
                block = str((attrs.get("blockID") or {}).get("string") or device)
                model = str((attrs.get("model") or {}).get("string") or "")
                if meta.get("deletionTimestamp"):
                    continue
                held_by = holders.get((fabric, block))
                if node is None:
                    fail = ("NoNode", "the allocation names no single node")
                elif held_by is not None:
                    # Never two resources for one block: the scheduler saw it free in the
                    # moment between an allocation ending and the pool dropping it.
                    fail = ("DeviceInUse", f"{block} is held by ComposableResource {held_by}")
                elif (
                    lim := limits(s.requests, fabric, model, node)
                ).max_size is not None and count(fabric, node, model) >= lim.max_size:
                    fail = ("MaxSizeReached", f"{node} already has {lim.max_size} x {model}")
                else:
                    actions.append(
                        CreateResource(
                            name,
                            resource_body(name, ref, pool, device, fabric, block, model, node),
                            ref,
                            device,
                        )
                    )
                    k = (fabric, node, model)
                    counts[k] = counts.get(k, 0) + 1
                    continue
            else:
                cr = found
                status = cr.get("status") or {}
                phase = status.get("phase")
                created = parse_time(_meta(cr).get("creationTimestamp")) or s.now
                fabric_error = _fabric_failure(cr) if cfg.fail_on_fabric_error else None
                if _meta(cr).get("deletionTimestamp"):
                    fail = (
                        "ResourceDeleted",
                        "the ComposableResource was deleted before it was online",
                    )
                elif phase == "Online" and status.get("deviceUUID"):
                    entry = {
                        "driver": cfg.driver,
                        "pool": pool,
                        "device": device,
                        "conditions": [
                            condition(
                                names.FABRIC_DEVICE_READY,
                                True,
                                "Attached",
                                f"attached to {(cr.get('spec') or {}).get('targetNode')} as "
                                f"{status['deviceUUID']}",
                                s.now,
                            )
                        ],
                        "data": {"uuid": status["deviceUUID"]},
                    }
                    ready.append((device, s.now - allocated_at if allocated_at else None))
                elif phase == "Failed":
                    fail = ("AttachFailed", str(status.get("error") or "the attach failed"))
                elif fabric_error is not None:
                    fail = ("FabricOperationFailed", fabric_error)
                elif s.now - created > cfg.attach_timeout:
                    fail = ("AttachTimeout", f"not online after {cfg.attach_timeout:.0f}s")
                else:
                    continue  # still attaching
            if fail is not None:
                reason, message = fail
                entry = {
                    "driver": cfg.driver,
                    "pool": pool,
                    "device": device,
                    "conditions": [
                        condition(names.FABRIC_DEVICE_FAILED, True, reason, message, s.now)
                    ],
                }
                failed.append((device, reason, message))
                doomed.append((name, reason, message))
                actions.append(Quarantine(pool, device, s.now + cfg.quarantine))
            assert entry is not None
            entries.append(entry)
            changed = changed or not _same_entry(observed, entry)
        if changed:
            actions.append(SetDeviceStatus(ref, entries, ready, failed))
        for name, reason, message in doomed:
            if name in resources and not _meta(resources[name]).get("deletionTimestamp"):
                actions.append(DeleteResource(name, reason, message))

    # 2. Resources whose allocation ended: release (Online) or clean up (never online).
    idle: list[tuple[float, JSON]] = []
    for cr in s.resources:
        meta = _meta(cr)
        if not managed(cr) or meta.get("deletionTimestamp"):
            continue
        spec, status = cr.get("spec") or {}, cr.get("status") or {}
        ann = meta.get("annotations") or {}
        phase = status.get("phase")
        claim_ref = spec.get("claimRef")
        if claim_ref:
            pool, device = ann.get(ANN_POOL, ""), ann.get(ANN_POOL_DEVICE, "")
            holder = claims_by_uid.get(claim_ref.get("uid"))
            live = holder is not None and any(
                (r.get("pool"), r.get("device")) == (pool, device)
                for r in our_results(holder, cfg.driver)
            )
            if live:
                continue
            if phase == "Online":
                if (pool, device) in s.pool_devices:
                    continue  # the pool publisher drops it first: published exactly once
                actions.append(
                    PatchResource(
                        meta["name"],
                        {
                            "metadata": {
                                "annotations": {
                                    ANN_LAST_USED: format_time(s.now),
                                    ANN_IN_USE_BY: None,
                                }
                            },
                            "spec": {"claimRef": None},
                        },
                        "Released",
                        f"claim {claim_ref.get('namespace')}/{claim_ref.get('name')} released "
                        "the GPU; it stays attached as an idle local device",
                    )
                )
            else:
                # Never online for this allocation (failed, or the claim went away mid-attach).
                actions.append(
                    DeleteResource(
                        meta["name"],
                        "AllocationEnded",
                        "the allocation ended before the GPU was online",
                    )
                )
            continue
        if phase != "Online":
            continue
        # 3. Idle bookkeeping: is the released GPU allocated again, as a local device?
        node = spec.get("targetNode", "")
        uuid = normalize_uuid(str(status.get("deviceUUID") or ""))
        local = s.local_devices.get((node, uuid))
        user = None
        if local is not None:
            for claim in s.claims:
                if any(
                    (r.get("pool"), r.get("device")) == (node, local)
                    for r in our_results(claim, cfg.driver)
                ):
                    user = _meta(claim).get("uid")
                    break
        if user:
            if ann.get(ANN_IN_USE_BY) != user:
                actions.append(
                    PatchResource(
                        meta["name"],
                        {"metadata": {"annotations": {ANN_IN_USE_BY: user}}},
                        "InUse",
                        f"allocated as local device {local}",
                    )
                )
            continue
        if ann.get(ANN_IN_USE_BY):
            actions.append(
                PatchResource(
                    meta["name"],
                    {
                        "metadata": {
                            "annotations": {ANN_IN_USE_BY: None, ANN_LAST_USED: format_time(s.now)}
                        }
                    },
                    "Idle",
                    "no allocation uses the GPU any more",
                )
            )
            continue
        last = (
            parse_time(ann.get(ANN_LAST_USED))
            or parse_time(status.get("attachedAt"))
            or parse_time(meta.get("creationTimestamp"))
            or s.now
        )
        idle.append((last, cr))

    # 4. Idle scale-down: least recently used first, honouring min/max.
    for last, cr in sorted(idle, key=lambda t: (t[0], _meta(t[1])["name"])):
        spec = cr.get("spec") or {}
        fabric, node, model = (
            spec.get("fabric", ""),
            spec.get("targetNode", ""),
            spec.get("model") or "",
        )
        node_lim = limits(s.requests, fabric, model, node)
        cluster_lim = limits(s.requests, fabric, model, None)
        n_node, n_all = count(fabric, node, model), count(fabric, None, model)
        over = (node_lim.max_size is not None and n_node > node_lim.max_size) or (
            cluster_lim.max_size is not None and n_all > cluster_lim.max_size
        )
        expired = s.now - last >= cfg.no_removal
        if not (over or expired):
            continue
        if n_node - 1 < node_lim.min_size or n_all - 1 < cluster_lim.min_size:
            continue
        reason = "IdleTimeout" if expired else "OverMaxSize"
        actions.append(
            DeleteResource(_meta(cr)["name"], reason, f"idle since {format_time(last)}; detaching")
        )
        counts[(fabric, node, model)] = counts.get((fabric, node, model), 0) - 1

    # 5. Quarantines that ran out.
    for rule in s.quarantines:
        expires = parse_time((_meta(rule).get("annotations") or {}).get(ANN_EXPIRES))
        if expires is None or expires <= s.now:
            actions.append(Unquarantine(_meta(rule)["name"]))
    return actions


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
    spec: JSON = {
        "fabric": fabric,
        "deviceID": block,
        "targetNode": node,
        "claimRef": {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid},
    }
    if model:
        spec["model"] = model
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
