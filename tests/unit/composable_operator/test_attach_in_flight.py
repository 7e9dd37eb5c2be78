"""A resource deleted mid-attach: the detach's decisions while an attach of
ours may still land, the status record that survives a restart, and the attach daemon
following a recorded task."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.fabric import backend as b
from composable_operator.reconcile import (
    REQUEST_SETTLE_SECONDS,
    AttachObservation,
    AttachRecord,
    CallState,
    DetachObservation,
    InFlight,
    attach_in_flight,
    decide_attach,
    decide_detach,
    parse_attach_record,
)


def dev(state: b.DeviceState = "free", host: str | None = None) -> b.Device:
    return b.Device(id="gpu-1", model="H100", zone="z1", uuid="uuid-1", state=state, host=host)


def detach(**kw: Any) -> DetachObservation:
    base: dict[str, Any] = dict(
        device=dev(), host="h1", tainted=False, referencing_claims=(), force=False
    )
    return DetachObservation(**{**base, **kw})


REQUEST = AttachRecord("h1", 1000.0)
TASK = AttachRecord("h1", 1000.0, "/redfish/v1/TaskService/TaskMonitors/7", "/t/7")


class TestInFlight:
    def test_no_call_and_no_record_is_nothing(self) -> None:
        assert attach_in_flight(None, None, 2000.0) == InFlight()

    @pytest.mark.parametrize(
        ("call", "expected"),
        [
            ("running", InFlight(call_running=True)),
            ("task", InFlight(task=True)),
            ("ended", InFlight()),
        ],
    )
    def test_this_processs_call_wins_over_the_record(
        self, call: CallState, expected: InFlight
    ) -> None:
        # The status record lags behind the call: a record with no task yet, read while
        # the call has ended, must not make the detach wait for a lost answer.
        assert attach_in_flight(REQUEST, call, 1001.0) == expected

    def test_after_a_restart_a_recorded_task_is_followed(self) -> None:
        assert attach_in_flight(TASK, None, 5000.0) == InFlight(task=True)

    def test_after_a_restart_an_unanswered_request_counts_its_age(self) -> None:
        assert attach_in_flight(REQUEST, None, 1004.5) == InFlight(unanswered_for=4.5)

    def test_a_clock_behind_the_record_counts_as_age_zero(self) -> None:
        assert attach_in_flight(REQUEST, None, 990.0) == InFlight(unanswered_for=0.0)


class TestDetachMidAttach:
    """The defect: the device read free while the attach request was still on its way, the
    detach reported done, and the attach then landed with no resource left."""

    @pytest.mark.parametrize("device", [dev(), dev("busy"), None])
    def test_an_unanswered_request_of_this_process_is_awaited(
        self, device: b.Device | None
    ) -> None:
        a = decide_detach(detach(device=device, attach=InFlight(call_running=True)))
        assert (a.kind, a.reason) == ("await_attach", "AttachInFlight")

    @pytest.mark.parametrize("device", [dev(), dev("busy"), dev("attached", "h9")])
    def test_a_running_attach_task_is_followed_before_deciding(self, device: b.Device) -> None:
        a = decide_detach(detach(device=device, attach=InFlight(task=True)))
        assert a.kind == "follow_attach"

    def test_once_the_attach_landed_the_usual_detach_follows(self) -> None:
        # Attached to our node: the in-flight attach is over, whatever memory says.
        for p in (InFlight(call_running=True), InFlight(task=True), InFlight(unanswered_for=0)):
            assert decide_detach(detach(device=dev("attached", "h1"), attach=p)).kind == "taint"
            a = decide_detach(detach(device=dev("attached", "h1"), attach=p, tainted=True))
            assert a.kind == "detach"

    def test_a_block_being_composed_is_waited_for(self) -> None:
        a = decide_detach(detach(device=dev("busy")))
        assert (a.kind, a.reason) == ("wait", "FabricBusy")

    def test_a_request_lost_with_a_restart_is_given_time_to_land(self) -> None:
        a = decide_detach(detach(attach=InFlight(unanswered_for=5.0)))
        assert (a.kind, a.reason) == ("wait", "AttachUnanswered")
        assert a.delay == pytest.approx(REQUEST_SETTLE_SECONDS - 5.0)

    def test_a_request_older_than_the_settle_time_no_longer_holds_the_detach(self) -> None:
        a = decide_detach(detach(attach=InFlight(unanswered_for=REQUEST_SETTLE_SECONDS)))
        assert a.kind == "done"

    def test_a_device_the_fabric_does_not_know_is_done_even_with_an_old_request(self) -> None:
        assert decide_detach(detach(device=None, attach=InFlight(unanswered_for=1))).kind == (
            "done"
        )

    @settings(max_examples=300)
    @given(
        state=st.sampled_from(["free", "attached", "busy"]),
        host=st.sampled_from([None, "h1", "h9"]),
        node_host=st.sampled_from([None, "h1"]),
        call=st.sampled_from([None, "running", "task", "ended"]),
        record=st.sampled_from([None, REQUEST, TASK]),
        age=st.floats(0, 100),
        tainted=st.booleans(),
        force=st.booleans(),
    )
    def test_never_done_while_an_attach_may_still_land(
        self,
        state: b.DeviceState,
        host: str | None,
        node_host: str | None,
        call: CallState | None,
        record: AttachRecord | None,
        age: float,
        tainted: bool,
        force: bool,
    ) -> None:
        device = dev(state, host if state != "free" else None)
        p = attach_in_flight(record, call, (record.requested_at if record else 0) + age)
        a = decide_detach(
            detach(device=device, host=node_host, attach=p, tainted=tainted, force=force)
        )
        if a.kind == "done":
            assert state != "busy"
            assert not (state == "attached" and node_host is not None and host == node_host)
            assert not p.call_running and not p.task
            assert p.unanswered_for is None or p.unanswered_for >= REQUEST_SETTLE_SECONDS


class TestRecord:
    def test_round_trip_through_status(self) -> None:
        for record in (REQUEST, TASK, AttachRecord("h1", 1700000000.123)):
            parsed = parse_attach_record({"pendingAttach": record.to_json()})
            assert parsed is not None
            assert replace(parsed, requested_at=round(parsed.requested_at, 3)) == record

    def test_the_operation_to_follow(self) -> None:
        assert REQUEST.operation() is None
        op = TASK.operation()
        assert op is not None and (op.monitor, op.task) == (TASK.monitor, TASK.task)
        only_task = AttachRecord("h1", 0, None, "/t/9").operation()
        assert only_task is not None and only_task.monitor == "/t/9"

    @pytest.mark.parametrize(
        "status",
        [
            {},
            {"pendingAttach": None},
            {"pendingAttach": "x"},
            {"pendingAttach": {"requestedAt": "2026-01-01T00:00:00Z"}},
            {"pendingAttach": {"host": "h1", "requestedAt": "yesterday"}},
        ],
    )
    def test_no_or_unreadable_record(self, status: dict[str, Any]) -> None:
        assert parse_attach_record(status) is None


class TestAttachAfterRestart:
    def test_a_recorded_task_on_a_block_being_composed_is_followed(self) -> None:
        o = AttachObservation(
            phase="Attaching",
            device=dev("busy"),
            host="h1",
            visible=False,
            elapsed=0,
            timeout=60,
            task_recorded=True,
        )
        assert decide_attach(o).kind == "follow"
        assert decide_attach(replace(o, task_recorded=False)).kind == "wait"
        # Ended meanwhile: the fabric decides, not the record.
        assert decide_attach(replace(o, device=dev("attached", "h1"))).kind == "await_visible"
