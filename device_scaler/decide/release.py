"""Phase 2: resources whose allocation ended: release (Online) or clean up (never online).

The same pass over the scaler's resources does phase 3 (idle.py) for the released ones.
"""

from __future__ import annotations

from collections.abc import Mapping

from api.v1alpha1 import ClaimRef
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import format_time
from composable_dra.model.names import ANN_IN_USE_BY, ANN_POOL, ANN_POOL_DEVICE
from composable_dra.model.sizing import ANN_LAST_USED
from device_scaler.decide.actions import Action, DeleteResource, PatchResource
from device_scaler.decide.idle import IdleGPU, idle_bookkeeping
from device_scaler.decide.reading import managed, meta_of, our_results
from device_scaler.decide.view import DecisionView


def allocation_ended(
    view: DecisionView, cr: JSON, ref: ClaimRef, claims_by_uid: Mapping[str, JSON]
) -> Action | None:
    """A resource made for a claim: None while that allocation lasts."""
    meta = meta_of(cr)
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
        "Released",
        f"claim {ref.namespace}/{ref.name} released the GPU; it stays attached as an idle "
        "local device",
        patch={
            "metadata": {
                "annotations": {ANN_LAST_USED: format_time(view.s.now), ANN_IN_USE_BY: None}
            },
            "spec": {"claimRef": None},
        },
    )


def ended_allocations(view: DecisionView) -> tuple[list[Action], list[IdleGPU]]:
    claims_by_uid = {f.uid: f.claim for f in view.claims}
    actions: list[Action] = []
    idle: list[IdleGPU] = []
    for cr in view.s.resources:
        spec = view.specs.get(meta_of(cr)["name"])
        if spec is None or not managed(cr) or meta_of(cr).get("deletionTimestamp"):
            continue
        if spec.claim_ref is not None:
            ref = ClaimRef(spec.claim_ref.namespace, spec.claim_ref.name, spec.claim_ref.uid)
            if (action := allocation_ended(view, cr, ref, claims_by_uid)) is not None:
                actions.append(action)
            continue
        if (cr.get("status") or {}).get("phase") != "Online":
            continue
        step = idle_bookkeeping(view, cr, spec, view.users)
        if isinstance(step, IdleGPU):
            idle.append(step)
        elif step is not None:
            actions.append(step)
    return actions, idle
