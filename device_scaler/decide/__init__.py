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

One module per phase, in the order ``decide`` runs them: attach (1), release (2), idle (3),
scale_down (4), warm (4b, the warm standby), quarantines (5). They share what they read
(inputs, view, reading) and what they return (actions, built by builders).
"""

from __future__ import annotations

from composable_dra.model.sizing import ANN_LAST_USED
from device_scaler.decide.actions import (
    Action,
    CreateResource,
    DeleteResource,
    PatchResource,
    Quarantine,
    SetDeviceStatus,
    Unquarantine,
)
from device_scaler.decide.attach import pending_allocations
from device_scaler.decide.builders import (
    MANAGED_LABEL,
    MANAGED_VALUE,
    quarantine_body,
    quarantine_rule_name,
    resource_body,
    resource_name,
    standby_body,
)
from device_scaler.decide.inputs import ScalerSettings, ScalerSnapshot
from device_scaler.decide.quarantines import expired_quarantines
from device_scaler.decide.reading import allocation_node, managed
from device_scaler.decide.release import ended_allocations
from device_scaler.decide.scale_down import scale_down
from device_scaler.decide.view import Memo, index, live_counts
from device_scaler.decide.warm import returned, standby_phase

__all__ = [
    "ANN_LAST_USED",
    "MANAGED_LABEL",
    "MANAGED_VALUE",
    "Action",
    "CreateResource",
    "DeleteResource",
    "Memo",
    "PatchResource",
    "Quarantine",
    "ScalerSettings",
    "ScalerSnapshot",
    "SetDeviceStatus",
    "Unquarantine",
    "allocation_node",
    "decide",
    "managed",
    "quarantine_body",
    "quarantine_rule_name",
    "resource_body",
    "resource_name",
    "standby_body",
]


def decide(s: ScalerSnapshot, cfg: ScalerSettings, memo: Memo | None = None) -> list[Action]:
    """The phases in order; a later one sees the counts an earlier one changed. ``memo``
    keeps what a pass reads of each claim and resource for the next (view.Memo)."""
    view = index(s, cfg, memo)
    counts = live_counts(s.resources, view.specs)
    attach, counts = pending_allocations(view, counts)
    released, idle = ended_allocations(view)
    warm, keep, counts = standby_phase(view, counts, idle)
    return [
        *attach,
        *released,
        *warm,
        *scale_down(view, counts, [i for i in idle if not returned(i, warm)], keep),
        *expired_quarantines(s.quarantines, s.now),
    ]
