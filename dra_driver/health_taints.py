"""The node's slices carry each unhealthy device's health taints (the same as a pool
device's: composable_dra.model.health_rules.taints), beside any taint it has already."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from composable_dra.model import health_rules
from composable_dra.model.health import HealthReport


def apply(layout: list[dict[str, Any]], states: Mapping[str, HealthReport]) -> list[dict[str, Any]]:
    """``layout`` (slice specs) with the health taints of ``states`` (by device name)
    added to the devices they name; the specs are copied where they change."""
    if not any(health_rules.taints(r) for r in states.values()):
        return layout
    out = []
    for spec in layout:
        devices = []
        for dev in spec.get("devices") or []:
            extra = health_rules.taints(states.get(dev["name"]))
            devices.append({**dev, "taints": [*dev.get("taints", []), *extra]} if extra else dev)
        out.append({**spec, "devices": devices} if "devices" in spec else spec)
    return out
