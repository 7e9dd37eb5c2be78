"""What a change of a node device's health does: the local slice's taints, the kubelet's
health stream, the health metrics, and an Event on the Node for each transition."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from composable_dra.k8s import events
from composable_dra.model.health import HealthReport
from composable_dra.model.health_rules import event_of
from composable_dra.process import health_metrics, logs
from dra_driver.health_sources import States

COMPONENT = "composable-dra-plugin"


class HealthEffects:
    """The board's listener on a node."""

    def __init__(
        self,
        kube: Any,
        node: dict[str, Any],
        set_health: Callable[[States], None],
        changed: Callable[[], None],
    ) -> None:
        meta = node["metadata"]
        self._involved = {"kind": "Node", "apiVersion": "v1", "name": meta["name"]}
        self._involved["uid"] = meta.get("uid", "")
        self._kube, self._set_health, self._changed = kube, set_health, changed
        self._log = logs.get(__name__, node=meta["name"])

    def __call__(self, states: States, changed: list[HealthReport]) -> None:
        self._set_health(states)
        self._changed()
        health_metrics.record("plugin", changed, states.values())
        for report in changed:
            kind, reason, message = event_of(report)
            self._log.info(
                "device health changed",
                device=report.device,
                health=report.health.value,
                reason=report.reason.value if report.reason else None,
                source=report.source,
            )
            events.post(self._kube, self._involved, "default", kind, reason, message, COMPONENT)
