"""The fabric health of pool devices, debounced: each fresh inventory read is one read of
the fabric health source; a device that was unhealthy keeps its fault until the fabric
says it is fine for ``recover_after`` reads in a row (composable_dra.model.health_rules).
The publisher then publishes ``Device.fault`` as device taints on its next rewrite, so
only a transition costs a slice write."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from api.v1alpha1 import API_VERSION
from composable_dra.fabric import health as fabric_health
from composable_dra.fabric.backend import Device, Inventory
from composable_dra.k8s import events
from composable_dra.model import health_rules
from composable_dra.model.health import HealthReport, Reason
from composable_dra.model.health_rules import event_of
from composable_dra.model.names import normalize_uuid
from composable_dra.process import health_metrics, logs

Debounced = health_rules.Debounced
COMPONENT = "composable-dra-pool-publisher"
log = logs.get(__name__)


def debounce(
    prev: Mapping[str, Debounced], inv: Inventory, recover_after: int
) -> tuple[dict[str, Debounced], Inventory, list[HealthReport]]:
    """The next states per block, the inventory with each device's debounced fault, and
    the reports of the blocks whose state changed."""
    observed = {d.id: fabric_health.report(d.id, d.fault) for d in inv.devices.values()}
    nxt = health_rules.step_all(prev, observed, recover_after)
    changed = health_rules.transitions(prev, nxt)
    devices = {
        block: dataclasses.replace(dev, fault=nxt[block].report.reason)
        for block, dev in inv.devices.items()
    }
    return nxt, dataclasses.replace(inv, devices=devices), changed


class PoolHealth:
    """Per fabric, the debounced states of its blocks; each transition is logged, counted
    and posted as an Event on the Fabric (``kube``: None posts none)."""

    def __init__(self, recover_after: int = health_rules.RECOVER_AFTER, kube: Any = None) -> None:
        self.recover_after = recover_after
        self._kube = kube
        self._states: dict[str, dict[str, Debounced]] = {}

    def observe(self, fabric: str, inv: Inventory) -> Inventory:
        """A fresh inventory of ``fabric``, its faults debounced; logs each transition."""
        states, out, changed = debounce(self._states.get(fabric, {}), inv, self.recover_after)
        self._states[fabric] = states
        for report in changed:
            log.info(
                "pool device health changed",
                fabric=fabric,
                block=report.device,
                health=report.health.value,
                reason=report.reason.value if report.reason else None,
            )
            if self._kube is not None:
                involved = {"kind": "Fabric", "apiVersion": API_VERSION, "name": fabric}
                kind, reason, message = event_of(report)
                events.post(self._kube, involved, "default", kind, reason, message, COMPONENT)
        every = [s.report for f in self._states.values() for s in f.values()]
        health_metrics.record("pool-publisher", changed, every)
        return out


def health_taints(dev: Device) -> list[dict[str, str]]:
    """The device taints of a pool device's (debounced) fabric fault."""
    if dev.fault is None:
        return []
    return health_rules.taints(fabric_health.report(dev.id, dev.fault))


def fence_inventory(inv: Inventory, fenced: Mapping[str, str]) -> Inventory:
    """``inv`` with each fenced GPU (normalised UUID -> why, composable_dra.model.fence)
    Quarantined, unless the fabric reports a worse fault already."""
    if not fenced:
        return inv
    devices = {
        block: dataclasses.replace(dev, fault=Reason.QUARANTINED)
        if dev.fault is None and normalize_uuid(dev.uuid) in fenced
        else dev
        for block, dev in inv.devices.items()
    }
    return dataclasses.replace(inv, devices=devices)
