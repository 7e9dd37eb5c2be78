"""Tests set a GPU block's Redfish ``Status`` through the admin API, as a fabric manager
would report a failing or vanished device: ``PUT /admin/blocks/{id}/status`` with
``{"Health": "Critical"}`` (and/or ``"State": "Absent"``), ``DELETE`` to make it OK again.
The block and its GPU Processor then show that Status; the Fsas FM API shows it as the
resource's ``res_op_status``."""

from __future__ import annotations

from typing import Any

HEALTHS = frozenset({"OK", "Warning", "Critical"})
STATES = frozenset({"Enabled", "Absent", "UnavailableOffline", "Disabled", "StandbyOffline"})
OK = {"State": "Enabled", "Health": "OK"}


class StatusError(ValueError):
    pass


def parse(raw: Any) -> dict[str, str]:
    """The Status an admin request sets; StatusError for anything else."""
    if not isinstance(raw, dict) or not raw or set(raw) - {"Health", "State"}:
        raise StatusError("expected an object with Health and/or State")
    health, state = raw.get("Health", "OK"), raw.get("State", "Enabled")
    if health not in HEALTHS:
        raise StatusError(f"Health must be one of {sorted(HEALTHS)}")
    if state not in STATES:
        raise StatusError(f"State must be one of {sorted(STATES)}")
    return {"State": state, "Health": health}


def fsas_op_status(status: dict[str, str] | None) -> str:
    """The Fsas FM's res_op_status for a Status (first digit: 0 OK, 1 warning, 2 critical;
    a device gone is critical to the FM)."""
    if status is None:
        return "0"
    if status.get("Health") == "Critical" or status.get("State") in {
        "Absent",
        "UnavailableOffline",
    }:
        return "2"
    return "1" if status.get("Health") == "Warning" else "0"
