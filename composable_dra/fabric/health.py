"""A fabric device's health from what the fabric manager says, as pure functions.

Redfish: a resource block's and its GPU's ``Status`` (``Health`` Critical or Warning,
``State`` Absent or UnavailableOffline). Fsas: a resource's ``res_op_status``, whose first
digit is its health (0 OK, 1 warning, 2 critical). They face the network: any JSON value
gives a Reason or None (healthy), never an exception
(tests/unit/composable_dra/fabric/test_fabric_health.py fuzzes them).
"""

from __future__ import annotations

from typing import Any

from composable_dra.model.health import Health, HealthReport, Reason

_ABSENT_STATES = frozenset({"Absent", "UnavailableOffline"})
# Worst first: the reason of the worst status wins.
_ORDER = (Reason.FABRIC_ABSENT, Reason.FABRIC_CRITICAL, Reason.FABRIC_WARNING)
_FSAS = {"1": Reason.FABRIC_WARNING, "2": Reason.FABRIC_CRITICAL}


def _status_fault(status: Any) -> Reason | None:
    if not isinstance(status, dict):
        return None
    if status.get("State") in _ABSENT_STATES:
        return Reason.FABRIC_ABSENT
    health = status.get("Health")
    if health == "Critical":
        return Reason.FABRIC_CRITICAL
    if health == "Warning":
        return Reason.FABRIC_WARNING
    return None


def redfish_fault(*resources: Any) -> Reason | None:
    """The worst fault that the ``Status`` of any of ``resources`` (a block, its GPU)
    reports; None when all are fine or say nothing."""
    found = {_status_fault(r.get("Status")) for r in resources if isinstance(r, dict)}
    return next((reason for reason in _ORDER if reason in found), None)


def fsas_fault(resource: Any) -> Reason | None:
    """The fault a Fsas resource's ``res_op_status`` reports; None when it is OK."""
    if not isinstance(resource, dict):
        return None
    status = resource.get("res_op_status", "0")
    if isinstance(status, bool) or not isinstance(status, str | int):
        return None
    return _FSAS.get(str(status)[:1])


def report(device: str, fault: Reason | None) -> HealthReport:
    """The fabric source's report on ``device`` (a slice's device name)."""
    if fault is None:
        return HealthReport(device=device, health=Health.HEALTHY, source="fabric")
    return HealthReport(
        device=device,
        health=Health.UNHEALTHY,
        reason=fault,
        message=f"the fabric manager reports {fault.value}",
        source="fabric",
    )
