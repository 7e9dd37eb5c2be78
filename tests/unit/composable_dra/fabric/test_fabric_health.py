"""A fabric device's health from the fabric manager's answers: the mapping, and fuzzing
(whatever the answer holds, a Reason or None, never an exception)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from composable_dra.fabric import fsas_answers
from composable_dra.fabric.health import fsas_fault, redfish_fault, report
from composable_dra.model.health import Health, Reason
from tests.unit.fuzz_json import JSON_VALUES


def status(health: str = "OK", state: str = "Enabled") -> dict[str, Any]:
    return {"Status": {"Health": health, "State": state}}


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ([status()], None),
        ([status("Warning")], Reason.FABRIC_WARNING),
        ([status("Critical")], Reason.FABRIC_CRITICAL),
        ([status(state="Absent")], Reason.FABRIC_ABSENT),
        ([status(state="UnavailableOffline")], Reason.FABRIC_ABSENT),
        ([status("Warning"), status("Critical")], Reason.FABRIC_CRITICAL),  # the GPU's worse
        ([status("Critical"), status(state="Absent")], Reason.FABRIC_ABSENT),
        ([{}], None),
    ],
)
def test_redfish_status_to_reason(resources: list[Any], expected: Reason | None) -> None:
    assert redfish_fault(*resources) is expected


@pytest.mark.parametrize(
    ("op_status", "expected"),
    [
        ("0", None),
        ("0x01", None),
        ("1", Reason.FABRIC_WARNING),
        ("2", Reason.FABRIC_CRITICAL),
        (2, Reason.FABRIC_CRITICAL),
        (True, None),
        (None, None),
    ],
)
def test_fsas_op_status_to_reason(op_status: Any, expected: Reason | None) -> None:
    assert fsas_fault({"res_op_status": op_status}) is expected


def test_a_fsas_gpu_in_error_carries_its_fault() -> None:
    resource = {"res_uuid": "0123456789ab", "res_type": "gpu", "res_op_status": "2"}
    dev = fsas_answers.device_of(resource, None, "zone")
    assert dev is not None and dev.fault is Reason.FABRIC_CRITICAL and dev.state == "busy"


def test_report_of_a_fault() -> None:
    assert report("gpu-a", None).health is Health.HEALTHY
    got = report("gpu-a", Reason.FABRIC_CRITICAL)
    assert (got.health, got.reason, got.fatal, got.source) == (
        Health.UNHEALTHY,
        Reason.FABRIC_CRITICAL,
        True,
        "fabric",
    )


@settings(max_examples=300)
@given(a=JSON_VALUES, b=JSON_VALUES)
def test_fuzz_redfish_fault(a: Any, b: Any) -> None:
    got = redfish_fault(a, {"Status": b})
    assert got is None or isinstance(got, Reason)


@settings(max_examples=300)
@given(value=JSON_VALUES)
def test_fuzz_fsas_fault(value: Any) -> None:
    for resource in (value, {"res_op_status": value}):
        got = fsas_fault(resource)
        assert got is None or isinstance(got, Reason)
