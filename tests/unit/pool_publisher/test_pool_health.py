"""Pool devices' fabric health: debounced per read, published as device taints, and only a
transition rewrites the pool."""

from __future__ import annotations

import dataclasses
from typing import Any

from composable_dra.fabric.backend import Inventory
from composable_dra.model.health import Reason
from composable_dra.model.health_rules import TAINT_KEY
from pool_publisher.pool_health import PoolHealth, debounce
from pool_publisher.publish import desired_pools, plan_pools, pool_slices
from tests.unit.pool_publisher.test_pool_publisher import DRIVER, inventory, served, view


def with_fault(inv: Inventory, block: str, fault: Reason | None) -> Inventory:
    devices = dict(inv.devices)
    devices[block] = dataclasses.replace(devices[block], fault=fault)
    return dataclasses.replace(inv, devices=devices)


def taints_of(inv: Inventory, block: str) -> list[tuple[str, str, str]]:
    pools = desired_pools(view(inv), set())
    devices = [d for s in pool_slices(pools["fab/zone-1"], 1, DRIVER) for d in s["spec"]["devices"]]
    (dev,) = [d for d in devices if d["name"] == block]
    return [(t["key"], t["value"], t["effect"]) for t in dev.get("taints", [])]


def test_a_faulty_free_device_is_tainted_no_execute_when_fatal() -> None:
    assert taints_of(inventory(), "gpu-1") == []
    warn = with_fault(inventory(), "gpu-1", Reason.FABRIC_WARNING)
    assert taints_of(warn, "gpu-1") == [(TAINT_KEY, "FabricWarning", "NoSchedule")]
    crit = with_fault(inventory(), "gpu-1", Reason.FABRIC_CRITICAL)
    assert taints_of(crit, "gpu-1") == [
        (TAINT_KEY, "FabricCritical", "NoSchedule"),
        (TAINT_KEY, "FabricCritical", "NoExecute"),
    ]
    assert taints_of(crit, "gpu-2") == []


def test_debounce_holds_a_fault_until_n_fine_reads() -> None:
    health = PoolHealth(recover_after=2)
    bad = health.observe("fab", with_fault(inventory(), "gpu-1", Reason.FABRIC_CRITICAL))
    assert bad.devices["gpu-1"].fault is Reason.FABRIC_CRITICAL
    assert health.observe("fab", inventory()).devices["gpu-1"].fault is Reason.FABRIC_CRITICAL
    assert health.observe("fab", inventory()).devices["gpu-1"].fault is None


def test_debounce_reports_only_transitions() -> None:
    states, _, changed = debounce({}, inventory(), 1)
    assert changed == []  # healthy devices arriving are no event
    states, _, changed = debounce(states, with_fault(inventory(), "gpu-3", Reason.FABRIC_ABSENT), 1)
    assert [(r.device, r.reason) for r in changed] == [("gpu-3", Reason.FABRIC_ABSENT)]
    states, _, changed = debounce(states, with_fault(inventory(), "gpu-3", Reason.FABRIC_ABSENT), 1)
    assert changed == []


def test_only_a_health_transition_rewrites_the_pool() -> None:
    pools = desired_pools(view(inventory()), set())
    first = plan_pools(pools, [], DRIVER)
    observed = served(first.apply)
    same = plan_pools(pools, observed, DRIVER, first.generations)
    assert same.empty
    faulty = desired_pools(view(with_fault(inventory(), "gpu-1", Reason.FABRIC_WARNING)), set())
    plan = plan_pools(faulty, observed, DRIVER, first.generations)
    assert {s["spec"]["pool"]["name"] for s in plan.apply} == {"fab/zone-1"}
    zone_2 = [o for o in observed if o["spec"]["pool"]["name"] == "fab/zone-2"]
    again = plan_pools(faulty, [*zone_2, *served(plan.apply)], DRIVER, plan.generations)
    assert again.empty


def test_a_fenced_gpu_is_quarantined_unless_the_fabric_says_worse() -> None:
    from composable_dra.model import fence
    from composable_dra.model.names import ANN_FENCE
    from pool_publisher.pool_health import fence_inventory

    resources: list[dict[str, Any]] = [
        {
            "metadata": {"annotations": {ANN_FENCE: "flaky under load"}},
            "status": {"deviceUUID": "U-1"},
        },
        {"metadata": {"annotations": {ANN_FENCE: "x"}}, "status": {"deviceUUID": "u-2"}},
        {"metadata": {}, "status": {"deviceUUID": "u-3"}},
    ]
    fenced = fence.fenced(resources)
    assert fenced == {"u-1": "flaky under load", "u-2": "x"}
    inv = with_fault(inventory(), "gpu-2", Reason.FABRIC_CRITICAL)
    out = fence_inventory(inv, fenced)
    assert out.devices["gpu-1"].fault is Reason.QUARANTINED
    assert out.devices["gpu-2"].fault is Reason.FABRIC_CRITICAL
    assert out.devices["gpu-3"].fault is None
    assert taints_of(out, "gpu-1") == [(TAINT_KEY, "Quarantined", "NoSchedule")]
    assert fence_inventory(inv, {}) is inv


def test_each_pool_transition_is_an_event_on_the_fabric() -> None:
    created: list[dict[str, Any]] = []

    class Kube:
        def create(self, where: str, body: dict[str, Any]) -> dict[str, Any]:
            created.append(body)
            return body

    health = PoolHealth(recover_after=1, kube=Kube())
    health.observe("fab", inventory())
    assert created == []
    health.observe("fab", with_fault(inventory(), "gpu-4", Reason.FABRIC_ABSENT))
    health.observe("fab", with_fault(inventory(), "gpu-4", Reason.FABRIC_ABSENT))
    health.observe("fab", inventory())
    assert [(e["involvedObject"]["name"], e["reason"]) for e in created] == [
        ("fab", "DeviceUnhealthy"),
        ("fab", "DeviceHealthy"),
    ]
    assert "gpu-4" in created[0]["message"] and "FabricAbsent" in created[0]["message"]
