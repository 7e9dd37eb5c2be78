"""The Detacher (composable_operator/detach.py) drives one resource's detach without kopf:
taint, re-check, detach, let go, forgetting what this process kept of it; a claim that
still holds the device, or a fabric that cannot be read, asks to be called again
(RetryLater). Kube and the fabric are fakes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from api.v1alpha1 import FabricSpec
from composable_dra.fabric.backend import Device, Host, Operation
from composable_dra.fabric.errors import BusyError
from composable_dra.fabric.registry import FabricConfigError, FabricGoneError
from composable_dra.k8s.kube import JSON, NotFound
from composable_dra.model import names
from composable_operator.actions import EventType
from composable_operator.controller import Controller, ControllerSettings
from composable_operator.detach import RetryLater, UnpublishWaits
from tests.unit.composable_operator.test_attach_daemon import FABRIC, NODE


@dataclass
class Body:
    meta: dict[str, Any] = field(default_factory=lambda: {"uid": "u1"})
    spec: dict[str, Any] = field(
        default_factory=lambda: {"fabric": "fab", "deviceID": "gpu-1", "targetNode": "n1"}
    )
    status: dict[str, Any] = field(default_factory=lambda: {"phase": "Online"})


class Kube:
    """The API server as a detach reads and writes it: taint rules, claims, status."""

    def __init__(self, claims: list[JSON] | None = None) -> None:
        self.rules: dict[str, JSON] = {}
        self.claims = claims or []
        self.status: JSON = {}

    def get(self, path: str, **_: Any) -> JSON:
        if path.endswith("/devicetaintrules"):
            return {"items": list(self.rules.values())}
        if path.endswith("/resourceclaims"):
            return {"items": self.claims}
        return {"items": []}  # resourceslices: the node lists nothing

    def get_or_none(self, _path: str) -> JSON | None:
        return NODE

    def create(self, _path: str, body: JSON) -> JSON:
        self.rules[body["metadata"]["name"]] = body
        return body

    def delete(self, path: str) -> None:
        self.rules.pop(path.rsplit("/", 1)[-1])

    def apply(self, _path: str, obj: JSON, _manager: str) -> JSON:
        self.status = dict(obj["status"])
        return {"status": self.status}


class Fabric:
    """One device, attached to h1 until detached."""

    def __init__(
        self, unreadable: Exception | None = None, config: FabricConfigError | None = None
    ) -> None:
        self.dev = Device("gpu-1", "H100", "z1", "GPU-1", "attached", host="h1")
        self.error, self.config = unreadable, config
        self.detaches: list[tuple[str, str]] = []

    def get(self, _name: str) -> tuple[FabricSpec, Fabric]:  # the Fabrics registry
        if self.config is not None:
            raise self.config
        return FABRIC, self

    def hosts(self) -> dict[str, Host]:
        return {"h1": Host("h1", "uuid-h1")}

    def device(self, _id: str) -> Device:
        if self.error is not None:
            raise self.error
        return self.dev

    def detach(self, device_id: str, host: str) -> Operation | None:
        self.detaches.append((device_id, host))
        self.dev = replace(self.dev, state="free", host=None)
        return None


def detach(ctl: Controller, body: Body, retry: int = 0) -> list[tuple[EventType, str, str]]:
    events: list[tuple[EventType, str, str]] = []

    def post(kind: EventType, reason: str, message: str) -> None:
        events.append((kind, reason, message))

    asyncio.run(ctl.detacher.run("r1", body, post, retry))
    return events


def controller(kube: Kube, fabric: Fabric) -> Controller:
    return Controller(kube, fabrics=fabric, settings=ControllerSettings())  # type: ignore[arg-type]


def test_a_detach_taints_detaches_and_lets_go_forgetting_the_resource() -> None:
    kube, fabric = Kube(), Fabric()
    ctl = controller(kube, fabric)
    ctl.picks.remember("u1", "gpu-1")
    events = detach(ctl, Body())
    assert fabric.detaches == [("gpu-1", "h1")]
    assert kube.rules == {}  # tainted while it went, untainted once let go
    assert kube.status["phase"] == "Detaching"
    assert [reason for _, reason, _ in events] == ["Detaching", "Detached"]
    assert ctl.statuses.owned("r1") is None and ctl.picks.recorded("u1", {}) is None


def test_a_claim_that_holds_the_device_blocks_the_detach_with_the_taint_on() -> None:
    result = {"driver": names.DRIVER, "pool": names.pool_name("fab", "z1"), "device": "gpu-1"}
    claim = {
        "metadata": {"name": "c1", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    kube, fabric = Kube([claim]), Fabric()
    with pytest.raises(RetryLater) as raised:
        detach(controller(kube, fabric), Body())
    assert raised.value.delay == 5 and "ns/c1" in str(raised.value)
    assert fabric.detaches == [] and len(kube.rules) == 1


def test_an_unreadable_fabric_asks_to_be_called_again() -> None:
    kube, fabric = Kube(), Fabric(BusyError("busy"))
    with pytest.raises(RetryLater):
        detach(controller(kube, fabric), Body())
    fabric = Fabric(config=FabricConfigError("no secret"))
    with pytest.raises(RetryLater) as raised:
        detach(controller(kube, fabric), Body())
    assert raised.value.delay == 10 and fabric.detaches == []


def test_a_fabric_gone_lets_the_resource_go_loudly() -> None:
    kube, fabric = Kube(), Fabric(config=FabricGoneError("fab is gone"))
    ctl = controller(kube, fabric)
    ctl.statuses.known("r1", {"phase": "Online"})
    events = detach(ctl, Body())
    assert [(kind, reason) for kind, reason, _ in events] == [(EventType.WARNING, "FabricGone")]
    assert ctl.statuses.owned("r1") is None and fabric.detaches == []


def test_an_unpublish_wait_starts_once() -> None:
    waits = UnpublishWaits()
    assert waits.waited("u1") == 0
    assert waits.start("u1") and not waits.start("u1")
    assert waits.waited("u1") >= 0
    waits.release("u1")
    assert waits.start("u1")


def releasing(kube: Kube, fabric: Fabric, limit: float = 120.0) -> Controller:
    settings = ControllerSettings(release_limit=limit)
    return Controller(kube, fabrics=fabric, settings=settings)  # type: ignore[arg-type]


def test_with_host_release_on_it_asks_the_plugin_once_and_waits() -> None:
    kube, fabric = Kube(), Fabric()
    ctl = releasing(kube, fabric)
    events: list[tuple[EventType, str, str]] = []

    def look(body: Body) -> RetryLater:
        with pytest.raises(RetryLater) as raised:
            asyncio.run(ctl.detacher.run("r1", body, lambda *e: events.append(e), 0))
        return raised.value

    assert look(Body()).delay <= 2
    assert fabric.detaches == []
    asked = {c["type"]: c for c in kube.status["conditions"]}[names.RELEASE_REQUESTED]
    assert (asked["status"], asked["reason"]) == ("True", "AwaitingHostRelease")
    # The UUID the plugin looks for, also where no attach recorded it (deleted mid-attach).
    assert kube.status["deviceUUID"] == "GPU-1"
    held = {
        "type": names.HOST_RELEASED,
        "status": "False",
        "reason": "InUse",
        "message": "processes use the device (pid 7)",
    }
    # Looked at again, still held: the plugin's why in the message, no second Event.
    assert "pid 7" in str(look(Body(status={"phase": "Detaching", "conditions": [held]})))
    assert [r for _, r, _ in events].count("AwaitingHostRelease") == 1
    assert fabric.detaches == []


def test_once_the_host_released_it_the_fabric_is_called() -> None:
    kube, fabric = Kube(), Fabric()
    done = Body(
        status={
            "phase": "Detaching",
            "conditions": [
                {"type": names.HOST_RELEASED, "status": "True", "reason": "Released"},
            ],
        }
    )
    events = detach(releasing(kube, fabric), done)
    assert fabric.detaches == [("gpu-1", "h1")]
    assert [reason for _, reason, _ in events] == ["Detaching", "Detached"]


def test_force_detach_skips_the_release_with_a_warning() -> None:
    kube, fabric = Kube(), Fabric()
    body = Body()
    body.spec["forceDetach"] = True
    events = detach(releasing(kube, fabric), body)
    assert fabric.detaches == [("gpu-1", "h1")]
    assert (EventType.WARNING, "ForcedDetach") in {(k, r) for k, r, _ in events}


class NoRulesKube(Kube):
    """An API server that serves no resource.k8s.io/v1 DeviceTaintRules (v1.35, v1.36)."""

    def get(self, path: str, **query: Any) -> JSON:
        if path.endswith("/devicetaintrules"):
            raise NotFound(404, "NotFound", "the server could not find the requested resource")
        return super().get(path, **query)

    def create(self, path: str, body: JSON) -> JSON:
        if path.endswith("/devicetaintrules"):
            raise NotFound(404, "NotFound", "the server could not find the requested resource")
        return super().create(path, body)


def test_without_device_taint_rules_a_detach_rechecks_claims_and_detaches() -> None:
    kube, fabric = NoRulesKube(), Fabric()
    ctl = controller(kube, fabric)
    events = detach(ctl, Body())
    assert fabric.detaches == [("gpu-1", "h1")]
    assert [reason for _, reason, _ in events][-1] == "Detached"
    assert ctl.taints.served is False
    # The re-check of allocations still holds a claim's device.
    result = {"driver": names.DRIVER, "pool": names.pool_name("fab", "z1"), "device": "gpu-1"}
    claim = {
        "metadata": {"name": "c1", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    held = Fabric()
    with pytest.raises(RetryLater) as raised:
        detach(controller(NoRulesKube([claim]), held), Body())
    assert "ns/c1" in str(raised.value) and held.detaches == []
