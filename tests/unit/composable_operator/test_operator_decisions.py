"""The operator's pure decisions: attach, detach, requests, orphans, Redfish errors."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from api.v1alpha1 import ComposabilityRequestSpec
from composable_dra.fabric import backend as b
from composable_dra.fabric import errors as fe
from composable_dra.fabric.redfish import error_for
from composable_dra.fabric.retry_after import retry_after_seconds
from composable_dra.model.sizing import desired_size
from composable_operator.composability_requests import plan_request
from composable_operator.fabric_status import find_orphans, free_devices
from composable_operator.reconcile import (
    AttachObservation,
    ClaimResult,
    DetachObservation,
    decide_attach,
    decide_detach,
    referencing_claims,
)


def dev(
    id: str = "gpu-1",
    state: b.DeviceState = "free",
    host: str | None = None,
    model: str = "H100",
    zone: str = "z1",
) -> b.Device:
    return b.Device(id=id, model=model, zone=zone, uuid=f"uuid-{id}", state=state, host=host)


def attach(**kw: Any) -> AttachObservation:
    base: dict[str, Any] = dict(
        phase=None, device=dev(), host="h1", visible=False, elapsed=0.0, timeout=60.0
    )
    return AttachObservation(**{**base, **kw})


class TestAttach:
    def test_free_device_is_attached_to_the_nodes_host(self) -> None:
        a = decide_attach(attach())
        assert (a.kind, a.host) == ("attach", "h1")

    def test_attached_but_not_visible_waits_for_the_node(self) -> None:
        a = decide_attach(attach(device=dev(state="attached", host="h1")))
        assert (a.kind, a.device_uuid) == ("await_visible", "uuid-gpu-1")

    def test_attached_and_visible_is_online(self) -> None:
        a = decide_attach(attach(device=dev(state="attached", host="h1"), visible=True))
        assert a.kind == "online"

    def test_a_retry_after_a_lost_response_does_not_attach_again(self) -> None:
        # The fabric applied the change but the answer was lost: the re-read shows it.
        a = decide_attach(attach(phase="Attaching", device=dev(state="attached", host="h1")))
        assert a.kind != "attach"

    def test_device_on_another_host_waits_then_fails(self) -> None:
        other = dev(state="attached", host="h2")
        assert decide_attach(attach(device=other)).kind == "wait"
        assert decide_attach(attach(device=other, elapsed=61)).kind == "fail"

    def test_busy_device_waits(self) -> None:
        assert decide_attach(attach(device=dev(state="busy"))).kind == "wait"

    def test_unknown_device_fails(self) -> None:
        a = decide_attach(attach(device=None))
        assert (a.kind, a.reason) == ("fail", "DeviceNotFound")

    def test_node_off_the_fabric_waits_then_fails(self) -> None:
        assert decide_attach(attach(host=None)).kind == "wait"
        assert decide_attach(attach(host=None, elapsed=61)).reason == "NodeNotOnFabric"

    def test_not_visible_in_time_fails(self) -> None:
        a = decide_attach(attach(device=dev(state="attached", host="h1"), elapsed=61))
        assert (a.kind, a.reason) == ("fail", "DeviceNotVisible")


def detach(**kw: Any) -> DetachObservation:
    base: dict[str, Any] = dict(
        device=dev(state="attached", host="h1"),
        host="h1",
        tainted=False,
        referencing_claims=(),
        force=False,
    )
    return DetachObservation(**{**base, **kw})


class TestDetach:
    def test_taint_comes_first(self) -> None:
        assert decide_detach(detach()).kind == "taint"

    def test_allocated_device_is_not_detached(self) -> None:
        a = decide_detach(detach(tainted=True, referencing_claims=("ns/c",)))
        assert (a.kind, a.reason) == ("blocked", "InUseByClaim")

    def test_force_detach_skips_the_allocation_check(self) -> None:
        a = decide_detach(detach(tainted=True, referencing_claims=("ns/c",), force=True))
        assert a.kind == "detach"

    def test_tainted_and_unused_is_detached(self) -> None:
        assert decide_detach(detach(tainted=True)).kind == "detach"

    @pytest.mark.parametrize("device", [None, dev(state="free"), dev(state="attached", host="h9")])
    def test_nothing_attached_to_us_is_done(self, device: b.Device | None) -> None:
        assert decide_detach(detach(device=device)).kind == "done"

    def test_referencing_claims_matches_driver_pool_and_device(self) -> None:
        results = [
            ClaimResult("a/x", "drv", "fab/z1", "gpu-1"),
            ClaimResult("a/y", "other", "fab/z1", "gpu-1"),
            ClaimResult("a/z", "drv", "node-1", "gpu-abc"),
            ClaimResult("a/w", "drv", "node-1", "gpu-def"),
        ]
        refs = {("fab/z1", "gpu-1"), ("node-1", "gpu-abc")}
        assert referencing_claims(results, "drv", refs) == ("a/x", "a/z")


def inventory(*devices: b.Device, zones: dict[str, set[str]] | None = None) -> b.Inventory:
    zones = zones or {"z1": {"h1", "h2"}}
    return b.Inventory(
        hosts={h: b.Host(h, f"uuid-{h}") for hs in zones.values() for h in hs},
        devices={d.id: d for d in devices},
        zones={
            z: b.Zone(z, frozenset(hs), frozenset(d.id for d in devices if d.zone == z))
            for z, hs in zones.items()
        },
    )


def owned(name: str, node: str, used: str, claim: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "fabric": "f",
            "deviceID": name,
            "targetNode": node,
            **({"claimRef": {"namespace": "ns", "name": "c", "uid": "u"}} if claim else {}),
        },
        "status": {"phase": "Online", "lastUsedAt": used},
    }


class TestRequests:
    def spec(self, **kw: Any) -> ComposabilityRequestSpec:
        return ComposabilityRequestSpec.model_validate(
            {"fabric": "f", "model": "H100", "size": 2, **kw}
        )

    def test_size_is_clamped(self) -> None:
        assert desired_size(self.spec(size=5, maxSize=3)) == 3
        assert desired_size(self.spec(size=0, minSize=1)) == 1

    def test_grows_with_free_devices_of_the_model_the_node_reaches(self) -> None:
        inv = inventory(
            dev("g1"), dev("g2", model="A100"), dev("g3"), dev("g4", state="attached", host="h2")
        )
        plan = plan_request(self.spec(targetNode="n1"), [], inv, {"h1": "n1"}, taken=set())
        assert plan.create == [("g1", "n1"), ("g3", "n1")]

    def test_devices_named_elsewhere_are_not_taken(self) -> None:
        inv = inventory(dev("g1"), dev("g3"))
        plan = plan_request(self.spec(targetNode="n1"), [], inv, {"h1": "n1"}, taken={"g1"})
        assert plan.create == [("g3", "n1")]

    def test_cluster_wide_requests_spread_over_nodes(self) -> None:
        inv = inventory(dev("g1"), dev("g2"))
        plan = plan_request(self.spec(), [], inv, {"h1": "n1", "h2": "n2"}, taken=set())
        assert sorted(n for _, n in plan.create) == ["n1", "n2"]

    def test_shrinks_least_recently_used_first_and_spares_claimed(self) -> None:
        resources = [
            owned("old", "n1", "2026-01-01T00:00:00Z", claim=True),
            owned("mid", "n1", "2026-01-02T00:00:00Z"),
            owned("new", "n1", "2026-01-03T00:00:00Z"),
        ]
        plan = plan_request(self.spec(size=1), resources, inventory(), {"h1": "n1"}, set())
        assert plan.delete == ["mid", "new"]  # "old" serves a claim


class TestOrphans:
    def test_orphan_is_due_only_after_the_grace_period(self) -> None:
        inv = inventory(
            dev("g1", state="attached", host="h1"), dev("g2", state="attached", host="h1")
        )
        due, seen = find_orphans(inv, {"h1": "n1"}, {"g2"}, {}, now=100.0, grace=30.0)
        assert due == [] and seen == {"g1": 100.0}
        due, seen = find_orphans(inv, {"h1": "n1"}, {"g2"}, seen, now=131.0, grace=30.0)
        assert [(o.device, o.node) for o in due] == [("g1", "n1")]

    def test_devices_of_hosts_that_are_not_our_nodes_are_not_orphans(self) -> None:
        inv = inventory(dev("g1", state="attached", host="h2"))
        assert find_orphans(inv, {"h1": "n1"}, set(), {}, 0.0, 0.0)[0] == []

    def test_free_devices_are_counted_by_model_and_zone(self) -> None:
        inv = inventory(dev("g1"), dev("g2"), dev("g3", model="A100"), dev("g4", state="busy"))
        assert free_devices(inv) == [
            {"model": "A100", "zone": "z1", "count": 1},
            {"model": "H100", "zone": "z1", "count": 2},
        ]


class TestRedfishErrors:
    def body(self, message_id: str) -> dict[str, Any]:
        return {
            "error": {
                "code": "Base.1.19.GeneralError",
                "message": "x",
                "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": "m"}],
            }
        }

    @pytest.mark.parametrize(
        ("status", "message_id", "kind"),
        [
            (409, "Composition.1.1.ResourceBlockInUse", fe.InUseError),
            (400, "Base.1.19.ResourceNotFound", fe.NotFoundError),
            (503, "Base.1.19.ServiceTemporarilyUnavailable", fe.BusyError),
            (500, "Base.1.19.InternalError", fe.TransientError),
            (401, "Base.1.19.NoValidSession", fe.AuthError),
            (400, "Base.1.19.PropertyValueNotInList", fe.OperationFailedError),
        ],
    )
    def test_status_and_message_ids_map_to_typed_errors(
        self, status: int, message_id: str, kind: type[fe.FabricError]
    ) -> None:
        assert type(error_for(status, self.body(message_id), {}, "op")) is kind

    def test_retry_after_in_seconds_or_as_a_date(self) -> None:
        assert retry_after_seconds("7") == 7.0
        assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
        assert retry_after_seconds(None, default=2.0) == 2.0
        err = error_for(503, {}, {"retry-after": "3"}, "op")
        assert isinstance(err, fe.BusyError) and err.retry_after == 3.0

    def test_uuids_compare_across_sources(self) -> None:
        assert b.normalize_uuid("GPU-ABC") == b.normalize_uuid("abc")


def test_a_device_held_by_another_resource_waits_for_it() -> None:
    from composable_operator.reconcile import DeviceHolder, first_holder

    me = DeviceHolder("new", False, "2026-01-01T00:00:10Z")
    going = DeviceHolder("old", True, "2026-01-01T00:00:00Z")
    older = DeviceHolder("older", False, "2026-01-01T00:00:05Z")
    younger = DeviceHolder("younger", False, "2026-01-01T00:00:20Z")
    assert first_holder("new", me.created, [me]) is None
    assert first_holder("new", me.created, [me, going]) == "old"  # its detach may be running
    assert first_holder("new", me.created, [me, older]) == "older"
    assert first_holder("new", me.created, [me, younger]) is None  # it waits for us
    assert first_holder("younger", younger.created, [me, younger]) == "new"
    # Attached to our host by the other one: still not ours to go Online with.
    held = AttachObservation(
        phase="Attaching",
        device=dev(state="attached", host="h1"),
        host="h1",
        visible=True,
        elapsed=1,
        timeout=60,
        held_by="old",
    )
    assert decide_attach(held).kind == "wait"
    assert decide_attach(replace(held, elapsed=61)).kind == "fail"
    assert decide_attach(replace(held, phase="Online")).kind == "online"  # already ours
    assert decide_attach(replace(held, held_by=None)).kind == "online"
