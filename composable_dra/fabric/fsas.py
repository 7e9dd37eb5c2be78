"""The `fsas-fm` backend: the Fujitsu/Fsas CDI fabric manager (FM) API, over requests.

API facts (paths, fields, payloads) are in docs/fabrics.md, with where they were read.
In short: an OAuth token from the ID manager (Keycloak: password grant with the client's
id and secret), machines (hosts) with their attached resources under
``fabric_manager/api/v1/machines``, attach by ``PATCH machines/{m}/update`` and detach by
``DELETE machines/{m}/update``, both answered synchronously (200) with no task to follow.

With ``attach_by_model`` (a Fabric's ``attachBy: model``) it uses only what CoHDI's code
shows: the FM picks the GPU of a model (``attach_model``; a ``backend.DevicePicker``),
free GPUs are counts (``available-reserved-resources``), attached ones are read from the
machines. Without it (``attachBy: resource``), two things this backend needs that CoHDI's
public code does not show the FM doing, and that must be checked against Fsas's API
reference before use with a real FM (the emulator implements both unless told to behave
as CoHDI's CI mock of the FM, which does neither; docs/fabrics.md, "Assumptions"):
- free resources listed with their identity (``GET fabric_manager/api/v1/resources``);
  an FM without it answers 404, and the inventory fails saying so;
- an attach that names the resource: a ``res_uuid`` condition beside ``model``. The
  backend refuses an answer that attached any other resource (and detaches that one),
  so an FM that ignores the condition fails loudly instead of attaching a stranger.

Choices, as in the Redfish backend: TLS verified by default (the Fabric's CA, else the
certifi bundle; passed with each request, so that ``REQUESTS_CA_BUNDLE`` in the
environment does not replace it); no blind retries of changes (the operator re-reads and
decides again); the token is cached until shortly before it expires, and a 401 fetches a
new one and repeats that request once (a refused request changed nothing). Secrets never
reach logs or error messages, nor another host: no redirect is followed (requests would
re-send the token request's form, client secret and password included, to wherever a
307 points, https or not). Each request and its whole answer take at most ``timeout``
and ``http_answer.MAX_ANSWER`` bytes (http_answer.py); answers are read by the pure
functions of fsas_answers.py, so a malformed one is a typed FabricError.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import requests

from composable_dra.fabric.backend import Device, Host, Inventory, Operation, OperationStatus
from composable_dra.fabric.connection import DEFAULT, Connection
from composable_dra.fabric.errors import (
    AuthError,
    BadAnswerError,
    FabricError,
    NotFoundError,
    OperationFailedError,
    TransientError,
)
from composable_dra.fabric.fsas_answers import (
    GPU,
    device_of,
    error_for,
    free_count,
    listed,
    machine_devices,
    machine_id,
    resources_of,
    token_of,
    zone_id,
    zones_of,
)
from composable_dra.fabric.http_answer import parse_json, read_body
from composable_dra.fabric.http_deadline import DeadlineAdapter, deadline
from composable_dra.fabric.relogin import once_more_after_401
from composable_dra.process import logs

log = logs.get(__name__)

FM = "fabric_manager/api/v1"
# A token is renewed this long before it expires, so no request carries a dying one.
TOKEN_LEEWAY_S = 30.0
_SEGMENT = re.compile(r"^[A-Za-z0-9._:-]+$")  # DEVICE_ID's characters; quoted anyway
# Compressed answers would let a few bytes on the wire become gigabytes in memory.
_IDENTITY = {"Accept-Encoding": "identity"}


def segment(value: str, what: str) -> str:
    """A value that goes into a URL path as one segment; FabricError otherwise."""
    if not _SEGMENT.fullmatch(value) or value in (".", ".."):
        raise FabricError(f"invalid {what} {value!r}: not one URL path segment")
    return urllib.parse.quote(value, safe="")


@dataclass(frozen=True)
class FsasCredentials:
    """The Fabric's credentials Secret: the ID manager's client and its user. The two
    secrets stay out of its repr, so a traceback's locals never print them."""

    client_id: str
    client_secret: str = field(repr=False)
    username: str = ""
    password: str = field(default="", repr=False)

    def form(self) -> dict[str, str]:
        """The token request: the password grant when a user is given (as the FM's
        ID manager takes it), else the client credentials grant."""
        form = {"client_id": self.client_id, "client_secret": self.client_secret}
        if self.username:
            form |= {
                "grant_type": "password",
                "username": self.username,
                "password": self.password,
                "scope": "openid",
            }
        else:
            form["grant_type"] = "client_credentials"
        return form


class FsasFabricManagerBackend:
    def __init__(
        self,
        endpoint: str,
        credentials: FsasCredentials,
        *,
        tenant_uuid: str,
        realm: str,
        connection: Connection = DEFAULT,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.monotonic,
        attach_by_model: bool = False,
        models: tuple[str, ...] = (),
    ) -> None:
        # attach_by_model: the FM picks the GPU (DevicePicker; docs/fabrics.md). Free
        # capacity is then read as counts of ``models``, attached GPUs from the machines.
        self.picks_device = attach_by_model
        self.models = models
        self.endpoint = endpoint.rstrip("/")
        self.tenant = tenant_uuid
        self._token_path = (
            f"id_manager/realms/{segment(realm, 'realm')}/protocol/openid-connect/token"
        )
        self._creds = credentials
        self._timeout = connection.timeout
        if session is None:
            session = requests.Session()
            for scheme in ("https://", "http://"):  # one connection per concurrent call
                session.mount(scheme, DeadlineAdapter(pool_maxsize=connection.connections))
        self._http = session
        # Given with each request: a session's own verify loses to REQUESTS_CA_BUNDLE.
        self._verify: bool | str = connection.ca_bundle() or False
        self._http.verify = self._verify
        self._clock = clock
        self._lock = threading.Lock()  # guards the token
        self._token: tuple[str, float] | None = None  # (access token, expires at on clock)
        self.token_fetches = 0

    # -- transport -----------------------------------------------------------------------

    def _exchange(
        self, method: str, url: str, what: str, **kw: Any
    ) -> tuple[int, Any, Mapping[str, str]]:
        """One request and its whole answer within ``timeout``: the status, the JSON body
        (None when there is none, or when a failure's body is not JSON) and the headers.
        A redirect is answered as it came: never followed."""
        ends = time.monotonic() + self._timeout
        headers = {**_IDENTITY, **kw.pop("headers", {})}
        try:
            with deadline(ends):
                resp = self._http.request(
                    method,
                    url,
                    headers=headers,
                    timeout=self._timeout,
                    allow_redirects=False,
                    stream=True,
                    verify=self._verify,
                    **kw,
                )
        except requests.RequestException as exc:
            late = " within the call's time limit" if time.monotonic() >= ends else ""
            raise TransientError(f"{what}: no answer{late}: {type(exc).__name__}") from exc
        raw = read_body(resp, ends, what)
        status = resp.status_code
        try:
            body = parse_json(raw, what) if raw else None
        except BadAnswerError:
            if 200 <= status < 300:
                raise
            body = None  # a failure's page from a proxy, say: the status tells enough
        return status, body, resp.headers

    def _fetch_token(self) -> tuple[str, float]:
        url = f"{self.endpoint}/{self._token_path}"
        what = f"token request to {url}"
        status, answer, headers = self._exchange("POST", url, what, data=self._creds.form())
        if 300 <= status < 400:
            raise AuthError(
                f"{what} answered HTTP {status}, a redirect: not followed, so that the "
                "client secret and password go to no other place"
            )
        if status in (400, 401, 403):
            raise AuthError(f"{what} refused: HTTP {status}")
        if status != 200:
            raise error_for(status, answer, headers, "token request")
        token, lifetime = token_of(answer, time.time(), url)
        self.token_fetches += 1
        log.info("fsas token fetched", endpoint=self.endpoint, valid_s=round(lifetime))
        return token, lifetime + self._clock()

    def _bearer(self, stale: str | None = None) -> str:
        """A token valid for TOKEN_LEEWAY_S more seconds; a new one if ``stale`` is the
        cached one (the FM refused it). Concurrent callers share one fetch."""
        with self._lock:
            cached = self._token
            fresh = cached is not None and cached[1] - TOKEN_LEEWAY_S > self._clock()
            if cached is None or not fresh or cached[0] == stale:
                self._token = cached = self._fetch_token()
            return cached[0]

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
    ) -> tuple[int, Any, Mapping[str, str]]:
        url = f"{self.endpoint}/{path}"
        what = f"{method} {url}"
        params = {"tenant_uuid": self.tenant, **(query or {})}

        def send() -> tuple[int, tuple[int, Any, Mapping[str, str]], str]:
            token = self._bearer()
            bearer = {"Authorization": f"Bearer {token}"}
            answer = self._exchange(method, url, what, params=params, json=body, headers=bearer)
            return answer[0], answer, token

        # A token expired early or revoked: renewed, once (relogin.py).
        status, answer, headers = once_more_after_401(send, self._renew, what)
        if 300 <= status < 400:
            raise BadAnswerError(f"{what}: HTTP {status}, a redirect: not followed")
        return status, answer, headers

    def _renew(self, stale: str) -> None:
        self._bearer(stale=stale)

    def _get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        status, body, headers = self._call("GET", path, query=query)
        if status != 200:
            raise error_for(status, body, headers, f"GET {path}")
        if not isinstance(body, dict):
            raise BadAnswerError(f"GET {path}: the answer is not a JSON object")
        return body

    def _host(self, machine: Mapping[str, Any]) -> Host:
        mach = machine_id(machine)
        name = machine.get("mach_name")
        return Host(mach, mach, name if isinstance(name, str) else "")

    # -- reads ---------------------------------------------------------------------------

    def _machines(self) -> list[dict[str, Any]]:
        machines = listed(self._get(f"{FM}/machines"), "machines", f"GET {FM}/machines")
        return [m for m in machines if machine_id(m)]

    def hosts(self) -> dict[str, Host]:
        return {machine_id(m): self._host(m) for m in self._machines()}

    def _resources(self) -> list[dict[str, Any]]:
        status, body, headers = self._call("GET", f"{FM}/resources", query={"res_type": GPU})
        if status == 404:
            raise FabricError(
                f"GET {FM}/resources answered 404: this fabric manager does not list its GPUs "
                "by identity, which the fsas-fm backend needs (docs/fabrics.md, Assumptions)"
            )
        if status != 200:
            raise error_for(status, body, headers, f"GET {FM}/resources")
        return listed(body, "resources", f"GET {FM}/resources")

    def inventory(self) -> Inventory:
        if self.picks_device:
            return self._counted_inventory()
        machines = self._machines()
        hosts = {machine_id(m): self._host(m) for m in machines}
        devices: dict[str, Device] = {}
        for r in self._resources():
            device = device_of(r, machine_id(r) or None, zone_id(r))
            if device is not None:
                devices[device.id] = device
        return Inventory(hosts=hosts, devices=devices, zones=zones_of(machines, devices.values()))

    def _counted_inventory(self) -> Inventory:
        """The inventory of an FM that lists free GPUs as counts: the attached ones from
        the machines, then the free counts. In that order: an attach between the reads
        shows up as one GPU fewer, never as one counted twice."""
        machines = self._machines()
        hosts = {machine_id(m): self._host(m) for m in machines}
        devices = {d.id: d for m in machines for d in machine_devices(m)}
        # Each GPU stands in its machine's zone, so every zone has a machine to ask.
        zones = zones_of(machines, devices.values())
        counts = {
            (z, model): self._free_count(min(zone.hosts), model)
            for z, zone in zones.items()
            for model in self.models
        }
        return Inventory(hosts=hosts, devices=devices, zones=zones, free_counts=counts)

    def _free_count(self, machine: str, model: str) -> int:
        condition = json.dumps({"column": "model", "operator": "eq", "value": model})
        body = self._get(
            f"{FM}/machines/{segment(machine, 'host id')}/available-reserved-resources",
            {"res_type": GPU, "condition": condition},
        )
        return free_count(body, f"free GPUs of {model!r}")

    def host_devices(self, host_id: str) -> list[Device]:
        path = f"{FM}/machines/{segment(host_id, 'host id')}"
        found = listed(self._get(path), "machines", f"GET {path}")
        return [d for m in found for d in machine_devices(m)]

    def _picked_device(self, device_id: str) -> Device | None:
        # No resource endpoint on such an FM: a GPU is known while a machine has it.
        return next(
            (d for m in self._machines() for d in machine_devices(m) if d.id == device_id), None
        )

    def _scale_up(
        self, machine: str, host_id: str, conditions: list[dict[str, str]], what: str
    ) -> list[dict[str, Any]]:
        """CoHDI's scale-up of one GPU with these conditions: the machines it answers."""
        spec = {"res_type": GPU, "res_spec": {"condition": conditions}, "res_num": 1}
        status, body, headers = self._call(
            "PATCH", f"{FM}/machines/{machine}/update", body=self._update_body(host_id, spec)
        )
        if status != 200:
            raise error_for(status, body, headers, what)
        return listed(body, "machines", what)

    def attach_model(self, model: str, host_id: str) -> Device:
        machine = segment(host_id, "host id")
        condition = [{"column": "model", "operator": "eq", "value": model}]
        what = f"attach a {model} GPU to {host_id}"
        machines = self._scale_up(machine, host_id, condition, what)
        added = [d for m in machines for d in machine_devices({**m, "mach_uuid": host_id})]
        if not added:
            raise OperationFailedError(f"{what}: the answer names no GPU it attached")
        for extra in added[1:]:
            # One was asked for: give back any more, so that none is left untracked.
            self.detach(extra.id, host_id)
        return added[0]

    def device(self, device_id: str) -> Device | None:
        rid = segment(device_id, "device id")
        if self.picks_device:
            return self._picked_device(device_id)
        status, body, headers = self._call("GET", f"{FM}/resources/{rid}")
        if status == 404:
            return None
        what = f"GET resource {device_id}"
        if status != 200:
            raise error_for(status, body, headers, what)
        found = listed(body, "resources", what)
        r = found[0] if found else {}
        return device_of(r, machine_id(r) or None, zone_id(r))

    # -- changes -------------------------------------------------------------------------

    def _update_body(self, host_id: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "tenants": {
                "tenant_uuid": self.tenant,
                "machines": [{"mach_uuid": host_id, "resources": [{"res_specs": [spec]}]}],
            }
        }

    def attach(self, device_id: str, host_id: str) -> Operation | None:
        if self.picks_device:
            raise FabricError("this fabric manager picks the GPU: attach by model instead")
        rid, machine = segment(device_id, "device id"), segment(host_id, "host id")
        current = self.device(device_id)
        if current is None:
            raise NotFoundError(f"resource {device_id} not found")
        conditions = [
            {"column": "model", "operator": "eq", "value": current.model},
            {"column": "res_uuid", "operator": "eq", "value": device_id},
        ]
        what = f"attach {device_id} to {host_id}"
        added = [
            str(r.get("res_uuid"))
            for m in self._scale_up(machine, host_id, conditions, what)
            for r in resources_of(m)
        ]
        strangers = [a for a in added if a != rid]
        for other in strangers:
            # The FM chose another resource than the one named: give it back at once.
            self.detach(other, host_id)
        if rid not in added:
            raise OperationFailedError(
                f"{what}: the fabric manager attached {strangers or 'nothing'} instead"
            )
        return None

    def detach(self, device_id: str, host_id: str) -> Operation | None:
        segment(device_id, "device id")
        machine = segment(host_id, "host id")
        spec = {"res_type": GPU, "res_uuid": device_id, "res_num": 1}
        status, body, headers = self._call(
            "DELETE", f"{FM}/machines/{machine}/update", body=self._update_body(host_id, spec)
        )
        if status not in (200, 204):
            raise error_for(status, body, headers, f"detach {device_id} from {host_id}")
        return None

    def operation_status(self, op: Operation) -> OperationStatus:
        # Changes are synchronous here: an Operation is never handed out.
        return OperationStatus("done")

    def close(self) -> None:
        with self._lock:
            self._token = None
        self._http.close()
