"""Phase 4b: warm standby (device_scaler/standby.py), idle GPUs kept attached in each zone.

The standby resources already there are followed (used by a claim, failed, attaching); the
plan then says which to return and which to create; the idle rule keeps the ones it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from api.v1alpha1 import ComposableResourceSpec
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import parse_time
from composable_dra.model.names import ANN_IN_USE_BY, ANN_POOL, ANN_POOL_DEVICE, normalize_uuid
from composable_dra.model.sizing import limits
from device_scaler import standby as sb
from device_scaler.decide.actions import (
    Action,
    CreateResource,
    DeleteResource,
    PatchResource,
    Quarantine,
)
from device_scaler.decide.builders import standby_body
from device_scaler.decide.idle import IdleGPU
from device_scaler.decide.reading import fabric_failure, meta_of
from device_scaler.decide.view import Counts, DecisionView, count_key

Fits = Callable[[str, str, str], bool]  # (fabric, node, model): room under maxSize?


def fits_under_max(requests: list[JSON], counts: Counts) -> Fits:
    """Room for one more under a request's maxSize, at these counts."""

    def fits(fabric: str, node: str, model: str) -> bool:
        lim = limits(requests, fabric, model, node)
        return lim.max_size is None or counts.count(fabric, node, model) < lim.max_size

    return fits


def returned(gpu: IdleGPU, actions: Iterable[Action]) -> bool:
    """Whether the standby phase already deletes this idle GPU."""
    return any(isinstance(a, DeleteResource) and a.name == meta_of(gpu.cr)["name"] for a in actions)


def standby_free_blocks(view: DecisionView, users: set[tuple[str, str]]) -> list[sb.FreeBlock]:
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


def held_idle(idle: list[IdleGPU]) -> list[sb.Held]:
    """The idle GPUs taken from a pool, as the standby plan sees them."""
    return [
        sb.Held(
            meta_of(i.cr)["name"],
            pool,
            i.spec.target_node,
            i.spec.model or "",
            i.last_used,
            sb.STANDBY_LABEL in (meta_of(i.cr).get("labels") or {}),
            False,
        )
        for i in idle
        if (pool := (meta_of(i.cr).get("annotations") or {}).get(ANN_POOL))
    ]


@dataclass(frozen=True)
class Used:
    """A standby GPU serves a claim: its label goes."""

    action: PatchResource


@dataclass(frozen=True)
class Gone:
    """A standby GPU whose attach failed: quarantined and deleted."""

    actions: list[Action]


def standby_step(
    view: DecisionView,
    name: str,
    cr: JSON,
    spec: ComposableResourceSpec,
    users: Mapping[tuple[str, str], str],
) -> Used | Gone | sb.Held | None:
    """One standby resource already there; None: Online and idle (phase 3 counts it)."""
    s, ann = view.s, meta_of(cr).get("annotations") or {}
    phase = (cr.get("status") or {}).get("phase")
    uuid = normalize_uuid(str((cr.get("status") or {}).get("deviceUUID") or ""))
    local = s.local_devices.get((spec.target_node, uuid)) if uuid else None
    if ann.get(ANN_IN_USE_BY) or (local is not None and (spec.target_node, local) in users):
        # Serving a claim, it is an ordinary GPU from now on (released under the idle
        # rule): the label counts only the idle GPUs the standby holds.
        message = "serves a claim; no longer a standby GPU"
        patch = {"metadata": {"labels": {sb.STANDBY_LABEL: None}}}
        return Used(PatchResource(name, "StandbyUsed", message, patch=patch))
    created = parse_time(meta_of(cr).get("creationTimestamp")) or s.now
    trouble = fabric_failure(cr) or (
        f"not online after {view.cfg.attach_timeout:.0f}s"
        if phase != "Online" and s.now - created > view.cfg.attach_timeout
        else None
    )
    if phase == "Failed" or trouble is not None:
        # Quarantined like a claim's failed block, so the next pass picks another.
        actions: list[Action] = []
        if ann.get(ANN_POOL) and ann.get(ANN_POOL_DEVICE):
            until = s.now + view.cfg.quarantine
            actions.append(Quarantine(ann[ANN_POOL], ann[ANN_POOL_DEVICE], until))
        actions.append(DeleteResource(name, "StandbyFailed", trouble or "the attach failed"))
        return Gone(actions)
    if phase in (None, "Attaching"):
        pool = ann.get(ANN_POOL, "")
        return sb.Held(name, pool, spec.target_node, spec.model or "", s.now, True, True)
    return None


def carry_out(
    view: DecisionView, counts: Counts, plan: sb.Plan, used: bool
) -> tuple[list[Action], Counts]:
    """The plan's returns and creations, as actions; each sees the counts the last changed."""
    actions: list[Action] = []
    for name in plan.surplus:
        actions.append(
            DeleteResource(name, "StandbySurplus", "more standby GPUs idle than maxPerZone")
        )
        counts = counts.add(count_key(view.specs[name]), -1)
    # A replacement for a GPU just used waits a pass: its label goes first, so the labelled
    # idle GPUs never outnumber K, not even for a moment.
    for new in [] if used else plan.create:
        key = (new.fabric, new.node, new.block.model)
        if not fits_under_max(view.s.requests, counts)(*key):
            continue
        actions.append(CreateResource(new.name, standby_body(new), None, new.block.device))
        counts = counts.add(key)
    return actions, counts


def standby_phase(
    view: DecisionView, counts: Counts, idle: list[IdleGPU]
) -> tuple[list[Action], frozenset[str], Counts]:
    """Standby GPUs to attach or return, and the idle GPUs the idle rule must keep."""
    s = view.s
    if not s.standby.zones:
        return [], frozenset(), counts
    actions: list[Action] = []
    held = held_idle(idle)
    users = view.users
    used = False  # a standby GPU serves a claim since the last pass
    for name, cr in view.resources.items():
        spec = view.specs.get(name)
        if spec is None or sb.STANDBY_LABEL not in (meta_of(cr).get("labels") or {}):
            continue
        if spec.claim_ref is not None or meta_of(cr).get("deletionTimestamp"):
            continue
        step = standby_step(view, name, cr, spec, users)
        if isinstance(step, Used):
            actions.append(step.action)
            used = True
        elif isinstance(step, Gone):
            actions.extend(step.actions)
            counts = counts.add(count_key(spec), -1)
        elif step is not None:
            held.append(step)
    free = standby_free_blocks(view, set(users))
    plan = sb.plan(s.standby, held, free, s.now, fits_under_max(s.requests, counts))
    more, counts = carry_out(view, counts, plan, used)
    return actions + more, plan.keep, counts
