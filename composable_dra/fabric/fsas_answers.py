"""Reading the Fsas fabric manager's answers (shapes in docs/fabrics.md), as pure functions.

They face the network: whatever JSON value an answer holds, each returns what it means
or raises a typed FabricError (AuthError for a token answer that gives no usable token,
BadAnswerError for another shape than the API's), never another exception.
tests/unit/composable_dra/fabric/test_fsas_answers.py fuzzes them.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from api.v1alpha1 import DEVICE_ID
from composable_dra.fabric.backend import Device, Zone
from composable_dra.fabric.errors import (
    AuthError,
    BadAnswerError,
    FabricError,
    InsufficientError,
    InUseError,
    NotFoundError,
    OperationFailedError,
)
from composable_dra.fabric.health import fsas_fault
from composable_dra.fabric.http_answer import parse_json
from composable_dra.fabric.http_errors import Codes, answer_error

GPU = "gpu"
# A token is kept at most this long, whatever lifetime its answer claims (a 401 renews
# it sooner anyway).
MAX_TOKEN_LIFETIME = 86_400.0
_TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")  # RFC 6750's b64token: fit for a header
_DEVICE_ID = re.compile(DEVICE_ID)
# res_op_status: its first digit is the health (0 OK, 1 warning, 2 critical).
_HEALTHY = ("0", "1")
_TEXT = 300  # characters of the FM's own message kept in an error
# FM error codes (detail.code) whose meaning the status alone does not carry.
_CODE_ERRORS: Codes = {
    "E_RESOURCE_IN_USE": InUseError,
    "E_INSUFFICIENT_RESOURCES": InsufficientError,
    "E_NOT_FOUND": NotFoundError,
    "E_OPERATION_FAILED": OperationFailedError,
}


def error_for(status: int, body: Any, headers: Mapping[str, str], what: str) -> FabricError:
    """The typed error for a failed FM answer ({"status", "detail": {"code", "message"}})."""
    detail = body.get("detail") if isinstance(body, dict) else None
    code = str(detail.get("code", ""))[:_TEXT] if isinstance(detail, dict) else ""
    text = detail.get("message") if isinstance(detail, dict) else None
    if not isinstance(text, str):
        text = json.dumps(text) if text is not None else "no details"
    said = f"{code + ': ' if code else ''}{text[:_TEXT]}"
    return answer_error(status, headers, what, said, [code], _CODE_ERRORS)


def _seconds(value: Any) -> float | None:
    """A JSON number as finite seconds; None for anything else (a bool, a string, an
    integer too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


def token_expiry(answer: Mapping[str, Any], now: float) -> float:
    """When a token answer expires: ``expires_in``, else the JWT's ``exp`` claim."""
    expires_in = _seconds(answer.get("expires_in"))
    if expires_in is not None:
        return now + expires_in
    parts = str(answer.get("access_token", "")).split(".")
    if len(parts) == 3:
        try:
            raw = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
            claims = parse_json(raw, "the token's claims")
        except (binascii.Error, ValueError, BadAnswerError):
            claims = None
        exp = _seconds(claims.get("exp")) if isinstance(claims, dict) else None
        if exp is not None:
            return exp
    raise AuthError("the token answer says neither expires_in nor a JWT exp")


def token_of(answer: Any, now: float, where: str) -> tuple[str, float]:
    """The access token of a token answer (read at wall-clock ``now``) and how many
    seconds to keep it: at most MAX_TOKEN_LIFETIME, less than 0 when already expired."""
    if not isinstance(answer, dict):
        raise AuthError(f"token request to {where}: the answer is not an object")
    token = answer.get("access_token")
    if not isinstance(token, str) or not _TOKEN.fullmatch(token):
        raise AuthError(f"token request to {where}: no usable access_token in the answer")
    return token, min(token_expiry(answer, now) - now, MAX_TOKEN_LIFETIME)


def listed(body: Any, key: str, what: str) -> list[dict[str, Any]]:
    """The objects of ``body["data"][key]`` (a missing one is empty); BadAnswerError when
    the answer has another shape (a list for an object, an object for a list)."""
    data = body.get("data", {}) if isinstance(body, dict) else None
    found = data.get(key, []) if isinstance(data, dict) else None
    if not isinstance(found, list):
        raise BadAnswerError(f"{what}: the answer has no list data.{key}")
    return [item for item in found if isinstance(item, dict)]


def resources_of(machine: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The resources a machine lists (none when it lists them in another shape)."""
    found = machine.get("resources")
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def free_count(body: Any, what: str) -> int:
    """available-reserved-resources' count of free GPUs."""
    count = body.get("reserved_res_num_per_fabric") if isinstance(body, dict) else None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise BadAnswerError(f"{what}: not a count: {str(count)[:40]}")
    return count


def _model(resource: Mapping[str, Any]) -> str:
    spec = resource.get("res_spec")
    conditions = spec.get("condition", []) if isinstance(spec, dict) else []
    for c in conditions if isinstance(conditions, list) else []:
        if isinstance(c, dict) and c.get("column") == "model" and c.get("operator") == "eq":
            return _text(c.get("value", ""))
    return ""


def _text(value: Any) -> str:
    """A scalar of an answer as text ('' for a list or an object: no name is one)."""
    return "" if isinstance(value, dict | list) or value is None else str(value)


def device_of(resource: Mapping[str, Any], machine: str | None, zone: str) -> Device | None:
    """The Device a GPU resource describes (None for another type, or a bad id)."""
    rid = _text(resource.get("res_uuid"))
    if resource.get("res_type") != GPU or not _DEVICE_ID.fullmatch(rid):
        return None
    healthy = _text(resource.get("res_op_status", "0"))[:1] in _HEALTHY
    return Device(
        id=rid,
        model=_model(resource),
        zone=zone,
        uuid=_text(resource.get("res_serial_num")),
        state=("attached" if machine else "free") if healthy else "busy",
        host=machine,
        fault=fsas_fault(resource),
    )


def machine_id(item: Mapping[str, Any]) -> str:
    """A machine's id (mach_uuid); '' when it has none."""
    return _text(item.get("mach_uuid"))


def machine_devices(machine: Mapping[str, Any]) -> list[Device]:
    """The GPUs a machine lists as attached to it."""
    mach, zone = machine_id(machine), zone_id(machine)
    return [d for r in resources_of(machine) if (d := device_of(r, mach, zone)) is not None]


def zone_id(item: Mapping[str, Any]) -> str:
    """The zone of a machine or a resource: its fabric (resources reach their fabric's
    machines)."""
    return _text(item.get("fabric_uuid")) or f"fabric-{_text(item.get('fabric_id', ''))}"


def zones_of(machines: Iterable[Mapping[str, Any]], devices: Iterable[Device]) -> dict[str, Zone]:
    """The zones the machines and the GPUs stand in, each with its machines and GPUs."""
    hosts: dict[str, set[str]] = {}
    for m in machines:
        hosts.setdefault(zone_id(m), set()).add(machine_id(m))
    gpus: dict[str, set[str]] = {}
    for d in devices:
        gpus.setdefault(d.zone, set()).add(d.id)
    return {
        z: Zone(z, frozenset(hosts.get(z, ())), frozenset(gpus.get(z, ())))
        for z in sorted(hosts.keys() | gpus.keys())
    }
