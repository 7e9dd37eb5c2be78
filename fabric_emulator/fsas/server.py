"""The Fsas CDI fabric manager API, served beside Redfish on the same composition.

``FsasEmulator`` is the Redfish emulator with two more path trees: the ID manager's token
endpoint (``/id_manager/...``) and the fabric manager (``/fabric_manager/api/v1/...``).
Both APIs change one composition under one lock, with the same topology, fault rules
(latency, 503, 500, 409, dropped connections before or after the change, and
``task_failure``: the FM answers 500 and changes nothing), state file and admin API, so
a test can attach through the FM and watch the Redfish side (or the plugin) see it.
``FsasConfig.attach_by_model`` and ``list_resources`` make it behave as CoHDI's CI mock of
the FM where that differs from what the fsas-fm backend assumes (docs/fabrics.md).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

from aiohttp import web

from composable_dra.process import logs
from fabric_emulator import faults as faults_mod
from fabric_emulator import state
from fabric_emulator.fsas import api
from fabric_emulator.fsas.api import FsasError
from fabric_emulator.fsas.config import FsasConfig
from fabric_emulator.server import BodyRefused, Config, Emulator, Handler, read_json
from fabric_emulator.state import RedfishError
from fabric_emulator.topology import Host, Topology

log = logs.get(__name__)

FM = "/fabric_manager/api/v1"
IDM = "/id_manager/"
MAX_TOKENS = 10_000  # live tokens kept; the oldest go first
_KINDS = faults_mod.REQUEST_KINDS | faults_mod.TASK_KINDS


def _answer(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(body), content_type="application/json", headers=headers
    )


def _error(err: FsasError, headers: dict[str, str] | None = None) -> web.Response:
    return _answer(err.status, err.body(), headers)


def _from_rules(err: RedfishError) -> FsasError:
    """A refusal of the shared composition rules, in the FM's error shape."""
    ids = [str(m.get("MessageId", "")).rsplit(".", 1)[-1] for m in err.messages]
    code = next((api.CODES[i] for i in ids if i in api.CODES), "E_INVALID_PARAMETER")
    return FsasError(err.status, code, str(err))


class FsasEmulator(Emulator):
    def __init__(
        self,
        topology: Topology,
        config: Config,
        faults: faults_mod.Faults | None = None,
        fsas: FsasConfig | None = None,
    ) -> None:
        super().__init__(topology, config, faults)
        self.fsas = fsas or FsasConfig()
        self.tokens: dict[str, float] = {}  # token -> monotonic expiry
        self.token_grants = 0

    def app(self) -> web.Application:
        app = super().app()
        # First, so that the FM's paths never reach the Redfish/admin middleware.
        app.middlewares.insert(0, self._fsas_middleware)
        app.router.add_route("*", FM + "/{tail:.*}", self._unreached)
        app.router.add_route("*", IDM + "{tail:.*}", self._unreached)
        app.router.add_delete("/admin/fsas/tokens", self._admin_revoke)
        app.router.add_get("/admin/fsas/tokens", self._admin_tokens)
        return app

    async def _unreached(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPNotFound()  # the middleware answers these paths itself

    async def _admin_revoke(self, request: web.Request) -> web.StreamResponse:
        self.tokens.clear()
        return web.json_response({"ok": True})

    async def _admin_tokens(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"live": len(self.tokens), "granted": self.token_grants})

    @web.middleware
    async def _fsas_middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not (request.path.startswith(FM + "/") or request.path.startswith(IDM)):
            return await handler(request)
        decision = self.faults.decide(request.method, request.path, _KINDS)
        if decision.latency:
            await asyncio.sleep(decision.latency)
        rule = decision.rule
        if rule is not None:
            log.info("fault injected", kind=rule.kind, rule=rule.id, path=request.path)
        response: web.StreamResponse
        if rule is not None and rule.kind == "drop_before":
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)
        if rule is not None and rule.kind == "status503":
            retry = str(rule.retry_after)
            response = _error(FsasError(503, "E_BUSY", "try again later"), {"Retry-After": retry})
        elif rule is not None and rule.kind == "status500":
            response = _error(FsasError(500, "E_INTERNAL", "internal error"))
        elif rule is not None and rule.kind == "conflict409":
            response = _error(FsasError(409, "E_RESOURCE_IN_USE", "resource in use"))
        elif rule is not None and rule.kind == "task_failure" and request.path.endswith("/update"):
            failed = FsasError(500, "E_OPERATION_FAILED", "the operation failed; nothing changed")
            response = _error(failed)
        else:
            try:
                response = await self._dispatch(request)
            except FsasError as err:
                response = _error(err)
            except Exception:
                log.exception("internal error", method=request.method, path=request.path)
                response = _error(FsasError(500, "E_INTERNAL", "internal error"))
        if rule is not None and rule.kind == "drop_after" and request.transport is not None:
            request.transport.abort()
        response.headers.setdefault("Cache-Control", "no-cache")
        return response

    # ---- dispatch ------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        method, path = request.method, request.path
        if path.startswith(IDM):
            realm_path = f"{IDM}realms/{self.fsas.realm}/protocol/openid-connect/token"
            if path != realm_path:
                raise FsasError(404, "E_NOT_FOUND", "no such realm or endpoint")
            if method != "POST":
                raise FsasError(405, "E_METHOD", "POST only")
            return await self._token(request)
        self._authorize(request)
        parts = path[len(FM) + 1 :].split("/")
        if parts == ["machines"] and method == "GET":
            return self._machines(None)
        if len(parts) == 2 and parts[0] == "machines" and method == "GET":
            return self._machines(self._host(parts[1]))
        if len(parts) == 3 and parts[0] == "machines":
            host = self._host(parts[1])
            if parts[2] == "available-reserved-resources" and method == "GET":
                return self._available(request, host)
            if parts[2] == "update" and method == "PATCH":
                return await self._attach(request, host)
            if parts[2] == "update" and method == "DELETE":
                return await self._detach(request, host)
        if parts[0] == "resources" and not self.fsas.list_resources:
            raise FsasError(404, "E_NOT_FOUND", f"no {method} {path}")
        if parts == ["resources"] and method == "GET":
            return self._resources(None)
        if len(parts) == 2 and parts[0] == "resources" and method == "GET":
            if parts[1] not in self.topology.blocks:
                raise FsasError(404, "E_NOT_FOUND", "no such resource")
            return self._resources(parts[1])
        raise FsasError(404, "E_NOT_FOUND", f"no {method} {path}")

    async def _token(self, request: web.Request) -> web.StreamResponse:
        # The whole body: content.read(n) returns what has arrived, so a form split over
        # two TCP segments was refused as malformed.
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise FsasError(413, "invalid_request", "the form is too large") from None
        form = api.parse_token_form(raw)
        ok = secrets.compare_digest(form.client_id.encode(), self.fsas.client_id.encode())
        ok &= secrets.compare_digest(form.client_secret.encode(), self.fsas.client_secret.encode())
        if form.grant_type == "password":
            ok &= self.auth.credentials_ok(form.username, form.password)
        if not ok:
            return _answer(401, {"error": "invalid_client", "error_description": "bad credentials"})
        token_id = secrets.token_urlsafe(16)
        lifetime = self.fsas.token_seconds
        token = api.access_token(token_id, int(time.time()) + lifetime)
        now = time.monotonic()
        self.tokens = {t: e for t, e in self.tokens.items() if e > now}
        while len(self.tokens) >= MAX_TOKENS:
            self.tokens.pop(next(iter(self.tokens)))
        self.tokens[token] = now + lifetime
        self.token_grants += 1
        return _answer(
            200,
            {
                "access_token": token,
                "expires_in": lifetime,
                "refresh_expires_in": 0,
                "token_type": "Bearer",
                "not-before-policy": 0,
                "scope": "openid",
            },
        )

    def _authorize(self, request: web.Request) -> None:
        given = request.headers.get("Authorization", "")
        token = given[7:] if given.startswith("Bearer ") else ""
        if self.tokens.get(token, 0.0) <= time.monotonic():
            raise FsasError(401, "E_UNAUTHORIZED", "no valid token")
        if request.query.get("tenant_uuid") != self.fsas.tenant:
            raise FsasError(403, "E_FORBIDDEN", "tenant_uuid is missing or not this tenant")

    def _host(self, mach_uuid: str) -> Host:
        host = next((h for h in self.topology.hosts.values() if h.uuid == mach_uuid), None)
        if host is None:
            raise FsasError(404, "E_NOT_FOUND", "no such machine")
        return host

    def _machine(self, host: Host) -> dict[str, Any]:
        return api.machine_json(
            self.topology, host, self.comp.blocks_of(host.id), self.fsas.tenant, self.comp.status
        )

    def _machines(self, only: Host | None) -> web.Response:
        hosts = [only] if only else list(self.topology.hosts.values())
        return _answer(200, {"data": {"machines": [self._machine(h) for h in hosts]}})

    def _resources(self, only: str | None) -> web.Response:
        blocks = [self.topology.blocks[only]] if only else list(self.topology.blocks.values())
        out = []
        for b in blocks:
            host_id = self.comp.attached.get(b.id)
            r = api.resource_json(
                self.topology,
                b,
                self.topology.hosts[host_id] if host_id else None,
                self.comp.status,
            )
            if b.id in self.comp.composing or b.id in self.comp.detaching:
                r["res_op_status"] = "3"  # being changed (through Redfish)
            out.append(r)
        return _answer(200, {"data": {"resources": out}})

    def _free(self, host: Host, model: str | None) -> list[str]:
        busy = self.comp.attached.keys() | self.comp.composing.keys() | self.comp.detaching.keys()
        return sorted(
            b.id
            for b in self.topology.blocks.values()
            if b.id not in busy
            and self.topology.reachable(b.id, host.id)
            and (model is None or b.model == model)
        )

    def _available(self, request: web.Request, host: Host) -> web.Response:
        if request.query.get("res_type", api.GPU) != api.GPU:
            raise FsasError(400, "E_INVALID_PARAMETER", "res_type must be gpu")
        cond = api.parse_condition_query(request.query.get("condition"))
        if cond.column != "model":
            raise FsasError(400, "E_INVALID_PARAMETER", "condition must name model")
        machine = self._machine(host)
        zone = str(machine["fabric_uuid"])
        count = sum(1 for b in self._free(host, cond.value) if self.topology.blocks[b].zone == zone)
        return _answer(
            200, {"fabric_id": machine["fabric_id"], "reserved_res_num_per_fabric": count}
        )

    async def _body(self, request: web.Request) -> Any:
        """The whole JSON body, read as the Redfish side reads one (read_json: 415, 413 or
        400), in the FM's error shape."""
        try:
            return await read_json(request)
        except BodyRefused as refused:
            raise FsasError(refused.status, "E_INVALID_PARAMETER", str(refused)) from None

    async def _attach(self, request: web.Request, host: Host) -> web.StreamResponse:
        spec = api.parse_add(await self._body(request), self.fsas.tenant, host.uuid)
        if spec.res_type != api.GPU:
            raise FsasError(400, "E_INVALID_PARAMETER", "only res_type gpu is served")
        model, named = spec.wanted("model"), spec.wanted("res_uuid")
        if self.fsas.attach_by_model:
            named = None  # the FM picks, as CoHDI's CI mock does
        async with self.lock:
            if named is not None:
                block = self.topology.blocks.get(named)
                if block is None:
                    raise FsasError(404, "E_NOT_FOUND", "no such resource")
                if model is not None and block.model != model:
                    raise FsasError(400, "E_INVALID_PARAMETER", "res_uuid is not of that model")
                chosen = [named]
            else:
                chosen = self._free(host, model)[: spec.num]
                if len(chosen) < spec.num:
                    raise FsasError(409, "E_INSUFFICIENT_RESOURCES", "not enough free resources")
            try:
                state.check_change(self.topology, self.comp, host.id, chosen, [])
            except RedfishError as err:
                raise _from_rules(err) from None
            state.apply_change(self.comp, host.id, chosen, [])
            self.composed(host.id, chosen, [])
            await self.save()
            machine = self._machine(host)
        machine["resources"] = [r for r in machine["resources"] if r["res_uuid"] in chosen]
        log.info("fsas attach", machine=host.id, resources=chosen)
        return _answer(200, {"data": {"machines": [machine]}})

    async def _detach(self, request: web.Request, host: Host) -> web.StreamResponse:
        spec = api.parse_remove(await self._body(request), self.fsas.tenant, host.uuid)
        async with self.lock:
            if self.comp.attached.get(spec.res_uuid) != host.id:
                raise FsasError(404, "E_NOT_FOUND", "the resource is not on this machine")
            try:
                state.check_change(self.topology, self.comp, host.id, [], [spec.res_uuid])
            except RedfishError as err:
                raise _from_rules(err) from None
            state.apply_change(self.comp, host.id, [], [spec.res_uuid])
            self.composed(host.id, [], [spec.res_uuid])
            await self.save()
        log.info("fsas detach", machine=host.id, resource=spec.res_uuid)
        return _answer(200, {})
