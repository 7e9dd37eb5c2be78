"""The manual fence: a person annotates a ComposableResource ``composable.dra.io/fence``
(the value says why) to quarantine its GPU; the annotation's removal releases it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from composable_dra.model.health import Health, HealthReport, Reason
from composable_dra.model.names import ANN_FENCE, normalize_uuid

_WHY = 256  # characters of the annotation kept in messages


def fenced(resources: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Normalised device UUID -> why, for each fenced resource whose GPU is known."""
    out = {}
    for r in resources:
        annotations = (r.get("metadata") or {}).get("annotations") or {}
        if ANN_FENCE not in annotations:
            continue
        uuid = normalize_uuid(str((r.get("status") or {}).get("deviceUUID") or ""))
        if uuid:
            out[uuid] = str(annotations[ANN_FENCE])[:_WHY] or "fenced by hand"
    return out


def report(device: str, why: str) -> HealthReport:
    return HealthReport(device, Health.UNHEALTHY, Reason.QUARANTINED, message=why, source="manual")
