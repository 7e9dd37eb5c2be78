"""What a node device's health transition does: slice taints and the stream get every
state, each transition is counted and posted as an Event on the Node."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from composable_dra.model.health import Health, HealthReport, Reason
from composable_dra.model.health_rules import event_of
from dra_driver.health_effects import HealthEffects


class Kube:
    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []

    def create(self, where: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append((where, body))
        return body


def count(reason: str) -> float:
    got = REGISTRY.get_sample_value(
        "composable_dra_device_health_transitions_total",
        {"component": "plugin", "reason": reason},
    )
    return got or 0.0


def test_each_transition_is_an_event_on_the_node_and_counted() -> None:
    kube = Kube()
    published: list[dict[str, HealthReport]] = []
    pings: list[None] = []
    effects = HealthEffects(
        kube,
        {"metadata": {"name": "node-a", "uid": "n-uid"}},
        lambda s: published.append(dict(s)),
        lambda: pings.append(None),
    )
    bad = HealthReport("gpu-a", Health.UNHEALTHY, Reason.FABRIC_CRITICAL, "block failed", "fabric")
    before = count("FabricCritical")
    effects({"gpu-a": bad, "gpu-b": HealthReport("gpu-b", Health.HEALTHY)}, [bad])
    assert set(published[-1]) == {"gpu-a", "gpu-b"} and len(pings) == 1
    assert count("FabricCritical") == before + 1
    ((where, event),) = kube.created
    assert where.endswith("/namespaces/default/events")
    assert event["involvedObject"] == {
        "kind": "Node",
        "apiVersion": "v1",
        "name": "node-a",
        "uid": "n-uid",
    }
    assert (event["type"], event["reason"]) == ("Warning", "DeviceUnhealthy")
    assert "gpu-a" in event["message"] and "FabricCritical" in event["message"]
    assert "block failed" in event["message"]
    unhealthy = REGISTRY.get_sample_value(
        "composable_dra_device_health_unhealthy",
        {"component": "plugin", "reason": "FabricCritical"},
    )
    assert unhealthy == 1


def test_the_event_of_a_recovery_and_of_a_fence() -> None:
    assert event_of(HealthReport("gpu-a", Health.HEALTHY))[:2] == ("Normal", "DeviceHealthy")
    kind, reason, message = event_of(
        HealthReport("gpu-a", Health.UNHEALTHY, Reason.QUARANTINED, "burn-in", "manual")
    )
    assert (kind, reason) == ("Warning", "DeviceUnhealthy")
    assert "Quarantined" in message and "burn-in" in message
