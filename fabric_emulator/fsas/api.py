"""The Fsas CDI fabric manager's requests and answers, as pure functions.

Shapes follow what CoHDI's public clients send and read (docs/fabrics.md). Every parser
takes whatever a client sent and returns a typed request or raises :class:`FsasError`
(a 4xx answer): nothing else escapes, whatever the bytes.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fabric_emulator import block_status, limits
from fabric_emulator.topology import Block, Host, Topology

GPU = "gpu"
MAX_FORM = 16 * 1024  # bytes; a token request is a few hundred


class FsasError(Exception):
    """An error answer: ``{"status": N, "detail": {"code", "message", "data"}}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def body(self) -> dict[str, Any]:
        return {"status": self.status, "detail": {"code": self.code, "message": self.message}}


# MessageId of the shared composition rules (fabric_emulator.state) -> FM error code.
CODES = {
    "ResourceBlockInUse": "E_RESOURCE_IN_USE",
    "ResourceInUse": "E_RESOURCE_IN_USE",
    "ResourceNotFound": "E_NOT_FOUND",
    "ResourceBlockNotFound": "E_NOT_FOUND",
    "IncompatibleZone": "E_INCOMPATIBLE",
    "ResourceBlockInvalid": "E_INVALID_PARAMETER",
}


@dataclass(frozen=True)
class Condition:
    """``{"column", "operator": "eq", "value"}``: eq is the one operator, so it is not kept."""

    column: str
    value: str


@dataclass(frozen=True)
class AddSpec:
    """One res_specs entry of a scale-up (attach) request."""

    res_type: str
    conditions: tuple[Condition, ...]
    num: int

    def wanted(self, column: str) -> str | None:
        return next((c.value for c in self.conditions if c.column == column), None)


@dataclass(frozen=True)
class RemoveSpec:
    """One res_specs entry of a scale-down (detach) request."""

    res_type: str
    res_uuid: str
    num: int


def _bad(message: str) -> FsasError:
    return FsasError(400, "E_INVALID_PARAMETER", message)


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise _bad(f"{where}.{key} is required")
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _bad(f"{where}.{key} must be a {kind.__name__}")
    return value


def _spec_entries(body: Any, tenant: str, machine: str) -> list[Any]:
    """The res_specs of the one machine of a tenants/machines/resources body."""
    tenants = _field(body, "tenants", dict, "body")
    if _field(tenants, "tenant_uuid", str, "tenants") != tenant:
        raise FsasError(403, "E_FORBIDDEN", "tenant_uuid is not this tenant")
    machines = _field(tenants, "machines", list, "tenants")
    if len(machines) != 1:
        raise _bad("exactly one machine per request")
    if _field(machines[0], "mach_uuid", str, "machines[0]") != machine:
        raise _bad("mach_uuid differs from the machine in the path")
    resources = _field(machines[0], "resources", list, "machines[0]")
    if len(resources) != 1:
        raise _bad("exactly one resources entry per request")
    specs: list[Any] = _field(resources[0], "res_specs", list, "resources[0]")
    if len(specs) != 1:
        raise _bad("exactly one res_specs entry per request")
    return specs


def _num(spec: Any) -> int:
    num = _field(spec, "res_num", int, "res_specs[0]")
    if not 1 <= num <= 128:
        raise _bad("res_num must be from 1 to 128")
    return int(num)


def _condition(raw: Any) -> Condition:
    col = _field(raw, "column", str, "condition")
    op = _field(raw, "operator", str, "condition")
    if op != "eq":
        raise _bad(f"operator {op!r} is not supported (only eq)")
    return Condition(col, _field(raw, "value", str, "condition"))


def parse_add(body: Any, tenant: str, machine: str) -> AddSpec:
    spec = _spec_entries(body, tenant, machine)[0]
    res_type = _field(spec, "res_type", str, "res_specs[0]")
    raw = _field(_field(spec, "res_spec", dict, "res_specs[0]"), "condition", list, "res_spec")
    conditions = tuple(_condition(c) for c in raw)
    columns = [c.column for c in conditions]
    if len(set(columns)) != len(columns):
        raise _bad("a column may be named once")
    if any(c not in ("model", "res_uuid") for c in columns):
        raise _bad("conditions may name model and res_uuid only")
    add = AddSpec(res_type, conditions, _num(spec))
    if add.wanted("res_uuid") is not None and add.num != 1:
        raise _bad("res_num must be 1 when res_uuid is named")
    return add


def parse_remove(body: Any, tenant: str, machine: str) -> RemoveSpec:
    spec = _spec_entries(body, tenant, machine)[0]
    res_type = _field(spec, "res_type", str, "res_specs[0]")
    res_uuid = _field(spec, "res_uuid", str, "res_specs[0]")
    num = _num(spec)
    if num != 1:
        raise _bad("res_num must be 1 (one res_uuid per request)")
    return RemoveSpec(res_type, res_uuid, num)


def parse_condition_query(raw: str | None) -> Condition:
    """available-reserved-resources' ``condition`` query parameter (JSON, bounded as a
    body is: nested a thousand deep, ``json`` raised RecursionError, a 500)."""
    if raw is None:
        raise _bad("condition is required")
    try:
        value = limits.parse_json(raw.encode("utf-8", "surrogatepass"))
    except ValueError:
        raise _bad("condition is not JSON") from None
    return _condition(value)


@dataclass(frozen=True)
class TokenRequest:
    grant_type: str
    client_id: str
    client_secret: str
    username: str = ""
    password: str = ""


def parse_token_form(raw: bytes) -> TokenRequest:
    """An ``application/x-www-form-urlencoded`` token request (password or client
    credentials grant). 400 ``invalid_request`` for anything else."""
    if len(raw) > MAX_FORM:
        raise FsasError(400, "invalid_request", "the form is too large")
    try:
        text = raw.decode("utf-8")
        form = urllib.parse.parse_qs(text, keep_blank_values=True, strict_parsing=bool(text))
    except (UnicodeDecodeError, ValueError):
        raise FsasError(400, "invalid_request", "not a form") from None
    single = {}
    for key, values in form.items():
        if len(values) != 1:
            raise FsasError(400, "invalid_request", f"{key} given more than once")
        single[key] = values[0]
    grant = single.get("grant_type", "")
    needed = {"password": ("client_id", "client_secret", "username", "password")}.get(
        grant, ("client_id", "client_secret")
    )
    if grant not in ("password", "client_credentials"):
        raise FsasError(400, "unsupported_grant_type", f"grant_type {grant!r}")
    missing = [k for k in needed if not single.get(k)]
    if missing:
        raise FsasError(400, "invalid_request", f"missing {', '.join(missing)}")
    return TokenRequest(
        grant,
        single["client_id"],
        single["client_secret"],
        single.get("username", ""),
        single.get("password", ""),
    )


def access_token(token_id: str, expires_at: int) -> str:
    """A JWT-shaped token (CoHDI's clients read ``exp`` from its payload); unsigned."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'exp': expires_at, 'jti': token_id})}.x"


# -- answers -------------------------------------------------------------------------------


def fabric_index(topology: Topology, zone: str) -> int:
    return list(topology.zones).index(zone) + 1


def resource_json(
    topology: Topology,
    block: Block,
    machine: Host | None,
    status: Mapping[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A GPU resource; ``status``: the Redfish Status tests set per block, as the FM's
    res_op_status (block_status.fsas_op_status)."""
    return {
        "res_uuid": block.id,
        "res_name": block.id,
        "res_type": GPU,
        "res_status": 4,
        "res_op_status": block_status.fsas_op_status((status or {}).get(block.id)),
        "res_serial_num": block.uuid,
        "res_spec": {"condition": [{"column": "model", "operator": "eq", "value": block.model}]},
        "fabric_uuid": block.zone,
        "fabric_id": fabric_index(topology, block.zone),
        "mach_uuid": machine.uuid if machine else None,
    }


def machine_json(
    topology: Topology,
    host: Host,
    attached: list[str],
    tenant: str,
    status: Mapping[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A machine; its fabric is its first zone (an FM machine sits in one fabric)."""
    zones = topology.zones_of_host(host.id)
    zone = zones[0] if zones else ""
    return {
        "fabric_uuid": zone,
        "fabric_id": fabric_index(topology, zone) if zone else 0,
        "mach_uuid": host.uuid,
        "mach_id": list(topology.hosts).index(host.id) + 1,
        "mach_name": host.id,
        "mach_status": 15,
        "mach_status_detail": "ACTIVE",
        "tenant_uuid": tenant,
        "resources": [resource_json(topology, topology.blocks[b], host, status) for b in attached],
    }
