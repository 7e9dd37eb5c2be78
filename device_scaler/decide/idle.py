"""Phase 3: idle bookkeeping. Is a released GPU allocated again, as a local device?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from api.v1alpha1 import ComposableResourceSpec
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import format_time
from composable_dra.model.names import ANN_IN_USE_BY, normalize_uuid
from composable_dra.model.sizing import ANN_LAST_USED, last_used
from device_scaler.decide.actions import Action, PatchResource
from device_scaler.decide.reading import meta_of
from device_scaler.decide.view import DecisionView


@dataclass(frozen=True)
class IdleGPU:
    last_used: float
    cr: JSON
    spec: ComposableResourceSpec


def idle_bookkeeping(
    view: DecisionView,
    cr: JSON,
    spec: ComposableResourceSpec,
    users: Mapping[tuple[str, str], str],
) -> Action | IdleGPU | None:
    """A released, Online GPU: mark it in use or idle again, or count it idle."""
    meta, status = meta_of(cr), cr.get("status") or {}
    ann = meta.get("annotations") or {}
    node = spec.target_node
    local = view.s.local_devices.get((node, normalize_uuid(str(status.get("deviceUUID") or ""))))
    user = users.get((node, local)) if local is not None else None
    if user:
        if ann.get(ANN_IN_USE_BY) == user:
            return None
        return PatchResource(
            meta["name"],
            "InUse",
            f"allocated as local device {local}",
            patch={"metadata": {"annotations": {ANN_IN_USE_BY: user}}},
        )
    if ann.get(ANN_IN_USE_BY):
        stamp = {ANN_IN_USE_BY: None, ANN_LAST_USED: format_time(view.s.now)}
        return PatchResource(
            meta["name"],
            "Idle",
            "no allocation uses the GPU any more",
            patch={"metadata": {"annotations": stamp}},
        )
    return IdleGPU(last_used(cr, view.s.now), cr, spec)
