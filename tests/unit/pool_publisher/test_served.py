"""Pool slices on an API server without binding conditions or device taints (v1.35):
written as the server keeps them, held back from the scheduler, still zones for the
standby, and each waiting claim told why (pool_publisher/served.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from composable_dra.k8s.features import ApiFeatures, Feature
from composable_dra.model import names
from device_scaler.standby import zones_of
from pool_publisher import publish
from pool_publisher.publish import desired_pools, plan_pools
from pool_publisher.served import (
    EVERYTHING,
    HELD_BACK_LABEL,
    POOL_HELD_BACK,
    Served,
    as_served,
)
from tests.unit.pool_publisher.test_pool_publisher import inventory, view
from tests.unit.pool_publisher.test_window import claim, exactly, with_uses

DRIVER = names.DRIVER
JSON = dict[str, Any]
V135 = Served(binding_conditions=False, device_taints=False)
GATED = ("bindsToNode", "bindingConditions", "bindingFailureConditions", "taints")


def server_keeps(body: JSON, served: Served) -> JSON:
    """What a server of ``served`` stores of a slice: the gated fields dropped, without a
    word, plus what any server adds."""
    out = copy.deepcopy(body)
    out["metadata"]["resourceVersion"] = "7"
    for dev in out["spec"]["devices"]:
        for key in GATED:
            if (key == "taints" and not served.device_taints) or (
                key != "taints" and not served.binding_conditions
            ):
                dev.pop(key, None)
    return out


def pools() -> dict[str, publish.PoolSpec]:
    # gpu-2 allocated (its taint), gpu-1 attached elsewhere: the pool has both kinds.
    return desired_pools(view(inventory({"gpu-1": "attached"})), {("fab/zone-1", "gpu-2")})


@pytest.mark.parametrize("served", [V135, Served(binding_conditions=True, device_taints=False)])
def test_a_pool_the_server_keeps_as_written_is_not_written_again(served: Served) -> None:
    first = plan_pools(pools(), [], DRIVER, served=served)
    assert first.apply
    stored = [server_keeps(b, served) for b in first.apply]
    again = plan_pools(pools(), stored, DRIVER, first.generations, served=served)
    assert again.apply == [] and again.delete == []
    # Written as if the server kept everything, the pools never read back the same: the
    # publisher rewrote them on every pass (a new generation each time, on v1.35).
    loop = plan_pools(pools(), stored, DRIVER, first.generations)
    assert loop.apply


def test_without_binding_conditions_no_node_can_be_allocated_a_pool_device() -> None:
    [body] = [b for b in plan_pools(pools(), [], DRIVER, served=V135).apply if "zone-2" in str(b)]
    for dev in body["spec"]["devices"]:
        assert not set(GATED) & set(dev)
    for term in body["spec"]["nodeSelector"]["nodeSelectorTerms"]:
        ops = {r["operator"] for r in term["matchExpressions"] if r["key"] == HELD_BACK_LABEL}
        assert ops == {"Exists", "DoesNotExist"}  # no node meets both
        assert any(r["key"] != HELD_BACK_LABEL for r in term["matchExpressions"])


def test_the_standby_still_reads_a_held_back_pools_zone() -> None:
    bodies = plan_pools(pools(), [], DRIVER).apply
    held = [as_served(b, V135) for b in bodies]
    plugins = [{"spec": {"nodeName": n}} for n in ("node-a", "node-b", "node-c")]
    policy = {"fab": object()}
    assert zones_of(held + plugins, policy) == zones_of(bodies + plugins, policy)  # type: ignore[arg-type]
    assert {z.pool: z.nodes for z in zones_of(held + plugins, policy)} == {  # type: ignore[arg-type]
        "fab/zone-1": ("node-a", "node-b"),
        "fab/zone-2": ("node-b", "node-c"),
    }


def test_a_server_with_every_feature_gets_the_slices_unchanged() -> None:
    bodies = plan_pools(pools(), [], DRIVER).apply
    assert [as_served(b, EVERYTHING) for b in bodies] == bodies
    assert any("bindingConditions" in d for b in bodies for d in b["spec"]["devices"])


def test_served_from_the_probe() -> None:
    def found(*present: Feature) -> ApiFeatures:
        return ApiFeatures(("v1",), frozenset(Feature), frozenset(present), {})

    assert Served.of(found(*Feature)) == EVERYTHING
    assert Served.of(found(Feature.RESOURCE_V1)) == V135
    assert Served.of(found(Feature.BINDING_CONDITIONS)) == Served(True, False)


class EventRecorder:
    def __init__(self) -> None:
        self.events: list[JSON] = []

    def create(self, url: str, body: JSON) -> JSON:
        self.events.append(body)
        return body


def test_each_waiting_claim_is_told_once_why_no_pool_serves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = EventRecorder()
    pub = publish.PoolPublisher(kube, None, served=V135)  # type: ignore[arg-type]  # not started
    monkeypatch.setattr(pub.class_clash, "selecting", lambda drivers: {"composable-gpu"})
    mine, other = claim(requests=[exactly("composable-gpu")]), claim(requests=[exactly("x")])
    mine["metadata"].update(uid="u1", namespace="ns")
    other["metadata"].update(uid="u2", namespace="ns")
    drivers = {DRIVER}
    pub._window(*with_uses([mine, other]), drivers, 4)
    pub._window(*with_uses([mine, other]), drivers, 4)
    [event] = kube.events
    assert event["involvedObject"]["kind"] == "ResourceClaim"
    assert (event["involvedObject"]["uid"], event["type"]) == ("u1", "Warning")
    assert event["reason"] == POOL_HELD_BACK
    assert "DRADeviceBindingConditions" in event["message"]
    assert "spec.standby" in event["message"]
    # A server with binding conditions: nothing to tell.
    quiet = EventRecorder()
    served = publish.PoolPublisher(quiet, None)  # type: ignore[arg-type]  # not started
    monkeypatch.setattr(served.class_clash, "selecting", lambda drivers: {"composable-gpu"})
    served._window(*with_uses([mine]), drivers, 4)
    assert quiet.events == []
