"""The HTTP service: Redfish under ``/redfish``, the admin API under ``/admin``.

Request path for ``/redfish``: fault rules (latency, injected errors, dropped connections)
-> authentication -> the handler -> ``drop_after`` faults. Composition changes run under
one asyncio lock, so of two concurrent attaches of one block exactly one wins.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from composable_dra.process import logs
from composable_dra.serving.http import HttpServer, serve_app
from composable_dra.serving.limits import ServerLimits
from fabric_emulator import (
    block_status,
    host_bus,
    limits,
    messages,
    persistence,
    query,
    resources,
    state,
    tasks,
)
from fabric_emulator import faults as faults_mod
from fabric_emulator.auth import SESSIONS, Auth, is_public
from fabric_emulator.resources import ROOT, SYSTEMS, ReadView
from fabric_emulator.state import Composition, RedfishError
from fabric_emulator.topology import Topology

log = logs.get(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
JSON_TYPE = "application/json"
DEFAULT_USER = "admin"
DEFAULT_PASSWORD = "admin"  # noqa: S105 - the documented default of a test emulator


@dataclass
class Config:
    user: str = DEFAULT_USER
    password: str = DEFAULT_PASSWORD
    async_polls: int = 0  # 0: changes are synchronous; N: a task runs for N polls
    retry_after: int = 1  # Retry-After (s) on 202 and task monitors
    # A task also ends on its own this many seconds after it started, polled or not, as a
    # real fabric manager's would: a client that lost the 202 must not leave it pending.
    task_seconds: int = 10
    # A collection answers at most this many members at a time (query.py).
    page_size: int = query.DEFAULT_PAGE_SIZE
    state_file: Path | None = None
    # When set, /admin (but its health check) needs "Authorization: Bearer <token>".
    admin_token: str | None = None
    # The hosts' PCIe side (host_bus.py): where surprise removals are seen; None: unseen.
    host_state_dir: Path | None = None


class BodyRefused(Exception):
    """A request body this service will not read: status and why."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


async def read_json(request: web.Request) -> Any:
    """The JSON body of ``request`` (None when it has none), or BodyRefused.

    415 for a body that is not ``application/json``, 413 over ``limits.MAX_BODY`` bytes,
    400 for anything :func:`limits.parse_json` refuses.
    """
    if not request.can_read_body:
        return None
    if request.content_type != JSON_TYPE:
        raise BodyRefused(415, f"Content-Type must be {JSON_TYPE}, not {request.content_type}")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyRefused(413, f"bodies are limited to {limits.MAX_BODY} bytes") from None
    try:
        return limits.parse_json(raw)
    except ValueError as exc:
        raise BodyRefused(400, f"malformed JSON: {exc}") from None


def etag_of(payload: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return f'W/"{digest[:20]}"'


def _json(
    status: int, body: dict[str, Any] | None, headers: dict[str, str] | None = None
) -> web.Response:
    if body is None:
        return web.Response(status=status, headers=headers)
    return web.Response(
        status=status,
        text=json.dumps(body, indent=1),
        content_type=JSON_TYPE,
        charset="utf-8",
        headers=headers,
    )


def error_response(err: RedfishError) -> web.Response:
    return _json(err.status, err.body(), err.headers)


def _drop(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


def _log_fault(request: web.Request, rule: faults_mod.Rule, **extra: Any) -> None:
    where = {"method": request.method, "path": request.path}
    log.info("fault injected", kind=rule.kind, rule=rule.id, **where, **extra)


def _fault_error(rule: faults_mod.Rule | None) -> RedfishError | None:
    """The error an injected fault answers with instead of the handler, if it is one."""
    if rule is None:
        return None
    if rule.kind == "status503":
        return RedfishError(
            503,
            messages.base("ServiceTemporarilyUnavailable", rule.retry_after),
            headers={"Retry-After": str(rule.retry_after)},
        )
    if rule.kind == "status500":
        return RedfishError(500, messages.base("InternalError"))
    if rule.kind == "conflict409":
        return RedfishError(409, messages.base("ResourceInUse"))
    return None


ADD_ACTION = "ComputerSystem.AddResourceBlock"
REMOVE_ACTION = "ComputerSystem.RemoveResourceBlock"
_ACTION_PARAMS = frozenset({"ResourceBlock", "ResourceBlockETag", "ComputerSystemETag"})


class Emulator:
    def __init__(
        self, topology: Topology, config: Config, faults: faults_mod.Faults | None = None
    ) -> None:
        self.topology = topology
        self.config = config
        self._initial = (config.async_polls, config.retry_after, config.task_seconds)
        self.faults = faults or faults_mod.Faults()
        self.auth = Auth(config.user, config.password)
        self.tasks = tasks.TaskStore()
        self.lock = asyncio.Lock()
        self.comp = Composition()
        # Blocks removed while their host still held them (host_bus.py); never reset.
        self.surprise_removals: list[dict[str, str]] = []
        if config.state_file is not None:
            saved = persistence.load(config.state_file)
            if saved is not None:
                self.comp = Composition.from_json(saved, topology)
                log.info(
                    "composition loaded",
                    path=str(config.state_file),
                    attached=len(self.comp.attached),
                )

    # ---- state ---------------------------------------------------------------------------

    def view(self) -> ReadView:
        return ReadView(
            topology=self.topology,
            comp=self.comp,
            sessions=dict(self.auth.sessions),
            tasks={t.id: tasks.render(t) for t in self.tasks.tasks.values()},
            user=self.auth.user,
        )

    async def save(self) -> None:
        if self.config.state_file is not None:
            await asyncio.to_thread(persistence.save, self.config.state_file, self.comp.to_json())

    def composed(self, host: str, add: Iterable[str], remove: Iterable[str]) -> None:
        """A change took effect: the host's side sees GPUs come and go, and a removal the
        host was not ready for is recorded as a surprise removal (host_bus.py)."""
        root = self.config.host_state_dir
        if root is None:
            return
        for block_id in add:
            b = self.topology.blocks.get(block_id)
            if b is not None:
                host_bus.attach(root, host, b.id, b.uuid, b.model, b.memory_mib)
        for block_id in remove:
            b = self.topology.blocks.get(block_id)
            why = host_bus.detach(root, host, b.uuid) if b is not None else None
            if why is not None:
                self.surprise_removals.append({"block": block_id, "system": host, "why": why})
                log.warning("surprise removal", block=block_id, system=host, why=why)

    def dump(self) -> dict[str, Any]:
        """The composition in plain terms, for ``GET /admin/state``."""
        return {
            "blocks": {
                b.id: {
                    "zone": b.zone,
                    "model": b.model,
                    "uuid": b.uuid,
                    "memory_mib": b.memory_mib,
                    "state": self.comp.state_of(b.id),
                    "system": self.comp.attached.get(b.id) or self.comp.composing.get(b.id),
                    "status": self.comp.status.get(b.id, block_status.OK),
                }
                for b in self.topology.blocks.values()
            },
            "systems": {
                h.id: {
                    "uuid": h.uuid,
                    "zones": self.topology.zones_of_host(h.id),
                    "blocks": self.comp.blocks_of(h.id),
                }
                for h in self.topology.hosts.values()
            },
            "tasks": {t.id: t.state for t in self.tasks.tasks.values()},
            "surprise_removals": list(self.surprise_removals),
        }

    # ---- application -----------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=limits.MAX_BODY)
        app.router.add_route("*", "/redfish", self._redfish)
        app.router.add_route("*", "/redfish/{tail:.*}", self._redfish)
        # The test-only admin API behind the admin token: each resource and its verbs.
        admin: dict[str, dict[str, Handler]] = {
            "faults": {
                "GET": self._admin_faults_get,
                "POST": self._admin_faults_post,
                "PUT": self._admin_faults_put,
                "DELETE": self._admin_faults_clear,
            },
            "faults/{id}": {"DELETE": self._admin_faults_delete},
            "config": {
                "GET": self._admin_config_get,
                **dict.fromkeys(("PATCH", "PUT"), self._admin_config_patch),
            },
            "state": {"GET": self._admin_state},
            "reset": {"POST": self._admin_reset},
            "healthz": {"GET": self._admin_healthz},
            "blocks/{id}/status": dict.fromkeys(("PUT", "DELETE"), self._admin_block_status),
        }
        for tail, verbs in admin.items():
            for method, handler in verbs.items():
                app.router.add_route(method, f"/admin/{tail}", handler)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not request.path.startswith("/redfish"):
            if not self._admin_allowed(request):
                return web.json_response(
                    {"error": "the admin API needs 'Authorization: Bearer <admin token>'"},
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="fabric-emulator-admin"'},
                )
            try:
                return await handler(request)
            except BodyRefused as exc:
                return self._admin_error(str(exc), exc.status)
        decision = self.faults.decide(request.method, request.path, faults_mod.REQUEST_KINDS)
        if decision.latency:
            log.info("fault: latency", path=request.path, seconds=decision.latency)
            await asyncio.sleep(decision.latency)
        rule = decision.rule
        if rule is not None and rule.kind != "drop_after":
            _log_fault(request, rule)
        if rule is not None and rule.kind == "drop_before":
            _drop(request)
            return web.Response(status=500)
        canned = _fault_error(rule)
        response = (
            error_response(canned)
            if canned is not None
            else await self._authenticated(request, handler)
        )
        if rule is not None and rule.kind == "drop_after":
            _log_fault(request, rule, status=response.status)
            _drop(request)
        response.headers["OData-Version"] = "4.0"
        response.headers.setdefault("Cache-Control", "no-cache")
        return response

    def _admin_allowed(self, request: web.Request) -> bool:
        token = self.config.admin_token
        if not token or request.path == "/admin/healthz":
            return True
        given = request.headers.get("Authorization", "")
        # Header bytes that are not UTF-8 arrive as surrogates: never a match.
        given_bytes = given.encode("utf-8", "surrogatepass")
        return hmac.compare_digest(given_bytes, f"Bearer {token}".encode())

    async def _authenticated(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_public(request.method, request.path):
            who = self.auth.authenticate(request.headers)
            if who is None:
                err = RedfishError(
                    401,
                    messages.base("NoValidSession"),
                    headers={"WWW-Authenticate": 'Basic realm="fabric-emulator"'},
                )
                return error_response(err)
            request["session"] = who
        try:
            return await handler(request)
        except RedfishError as err:
            return error_response(err)
        except Exception:
            log.exception("internal error", method=request.method, path=request.path)
            return error_response(RedfishError(500, messages.base("InternalError")))

    # ---- Redfish dispatch --------------------------------------------------------------------

    async def _redfish(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        method = request.method
        if path in ("/redfish", "/redfish/"):
            if method not in ("GET", "HEAD"):
                raise self._not_allowed("GET, HEAD")
            return _json(200, {"v1": "/redfish/v1/"})
        norm = path if path == f"{ROOT}/" else path.rstrip("/")
        if norm == ROOT:
            norm = f"{ROOT}/"
        if method in ("GET", "HEAD"):
            return await self._get(request, norm)
        if method == "POST":
            if norm == SESSIONS:
                return await self._login(request)
            for action in (ADD_ACTION, REMOVE_ACTION):
                suffix = f"/Actions/{action}"
                if norm.endswith(suffix) and norm.startswith(f"{SYSTEMS}/"):
                    host = norm[len(f"{SYSTEMS}/") : -len(suffix)]
                    if host in self.topology.hosts:
                        return await self._action(request, host, action)
        if method == "PATCH" and norm.startswith(f"{SYSTEMS}/"):
            host = norm[len(f"{SYSTEMS}/") :]
            if host in self.topology.hosts:
                return await self._patch_system(request, host)
        if method == "DELETE" and norm.startswith(f"{SESSIONS}/"):
            return await self._logout(norm[len(SESSIONS) + 1 :])
        if self._exists(norm):
            raise self._not_allowed(self._allow(norm))
        raise self._missing(norm)

    def _exists(self, norm: str) -> bool:
        if norm in (f"{ROOT}/$metadata", f"{ROOT}/odata"):
            return True
        return resources.render(self.view(), norm) is not None

    def _allow(self, norm: str) -> str:
        if norm == SESSIONS:
            return "GET, HEAD, POST"
        if norm.startswith(f"{SESSIONS}/"):
            return "GET, HEAD, DELETE"
        if norm.startswith(f"{SYSTEMS}/") and norm.count("/") == 4:
            return "GET, HEAD, PATCH"
        return "GET, HEAD"

    def _not_allowed(self, allow: str) -> RedfishError:
        return RedfishError(405, messages.base("OperationNotAllowed"), headers={"Allow": allow})

    def _missing(self, norm: str) -> RedfishError:
        return RedfishError(404, messages.base("ResourceMissingAtURI", norm))

    async def _get(self, request: web.Request, norm: str) -> web.StreamResponse:
        if norm == f"{ROOT}/$metadata":
            return web.Response(
                text=resources.metadata_xml(), content_type="application/xml", charset="utf-8"
            )
        if norm == f"{ROOT}/odata":
            return _json(200, resources.odata_document())
        if norm.startswith(f"{tasks.MONITORS}/"):
            return await self._monitor(norm[len(tasks.MONITORS) + 1 :])
        if norm.startswith(f"{tasks.TASKS}/"):
            task = self.tasks.tasks.get(norm[len(tasks.TASKS) + 1 :])
            if task is not None:
                async with self.lock:
                    await self.tasks.poll(task)
        view = self.view()
        payload = resources.render(view, norm)
        if payload is None:
            raise self._missing(norm)
        q = query.parse(list(request.query.items()))
        payload = query.page(payload, q, self.config.page_size)
        payload = query.expand(payload, q.expand, q.levels, lambda uri: resources.render(view, uri))
        etag = etag_of(payload)
        headers = {"ETag": etag, "Allow": self._allow(norm)}
        if norm.startswith(f"{tasks.TASKS}/") and payload.get("TaskState") == "Running":
            headers["Retry-After"] = str(self.config.retry_after)
        return _json(200, payload, headers)

    async def _monitor(self, task_id: str) -> web.StreamResponse:
        task = self.tasks.tasks.get(task_id)
        if task is None or task.monitor_done:
            raise self._missing(f"{tasks.MONITORS}/{task_id}")
        async with self.lock:
            await self.tasks.poll(task)
        if not task.done:
            return _json(
                202,
                tasks.render(task),
                {"Location": task.monitor_uri, "Retry-After": str(self.config.retry_after)},
            )
        task.monitor_done = True
        assert task.result is not None
        status, body = task.result
        return _json(status, body, {"Link": f'<{task.uri}>; rel="describedby"'})

    # ---- sessions ----------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await read_json(request)
        except BodyRefused as exc:
            log.info("request body refused", path=request.path, status=exc.status, error=str(exc))
            if exc.status == 415:
                raise RedfishError(415, messages.base("HeaderInvalid", "Content-Type")) from None
            if exc.status == 413:
                raise RedfishError(413, messages.base("PayloadTooLarge")) from None
            raise RedfishError(400, messages.base("MalformedJSON")) from None
        if body is None:
            return {}
        if not isinstance(body, dict):
            raise RedfishError(400, messages.base("MalformedJSON"))
        return body

    async def _login(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        for key in ("UserName", "Password"):
            if key not in body:
                raise RedfishError(400, messages.base("PropertyMissing", key))
        result = self.auth.login(body["UserName"], body["Password"])
        if result is None:
            log.info("login refused")
            raise RedfishError(401, messages.base("NoValidSession"))
        token, info = result
        log.info("session created", session=info.id)
        payload = resources.session(info)
        return _json(201, payload, {"X-Auth-Token": token, "Location": payload["@odata.id"]})

    async def _logout(self, session_id: str) -> web.StreamResponse:
        if not self.auth.logout(session_id):
            raise self._missing(f"{SESSIONS}/{session_id}")
        log.info("session deleted", session=session_id)
        return web.Response(status=204)

    # ---- composition changes -------------------------------------------------------------

    def _etag(self, path: str) -> str | None:
        payload = resources.render(self.view(), path)
        return None if payload is None else etag_of(payload)

    async def _action(self, request: web.Request, host: str, action: str) -> web.StreamResponse:
        body = await self._body(request)
        for key in body:
            if key not in _ACTION_PARAMS:
                raise RedfishError(400, messages.base("ActionParameterUnknown", action, key))
        if "ResourceBlock" not in body:
            raise RedfishError(
                400, messages.base("ActionParameterMissing", action, "ResourceBlock")
            )
        ref = body["ResourceBlock"]
        uri = ref.get("@odata.id") if isinstance(ref, dict) else None
        if not isinstance(uri, str):
            raise RedfishError(
                400,
                messages.base(
                    "ActionParameterValueTypeError", json.dumps(ref), "ResourceBlock", action
                ),
            )
        block = state.block_id_from_uri(uri)
        if block is None:
            raise RedfishError(400, messages.composition("ResourceBlockNotFound", uri))
        system_uri = f"{SYSTEMS}/{host}"
        if_match = request.headers.get("If-Match")
        if if_match and if_match != "*" and if_match != self._etag(system_uri):
            raise RedfishError(412, messages.base("PreconditionFailed"))
        for param, target in (
            ("ComputerSystemETag", system_uri),
            ("ResourceBlockETag", f"{resources.BLOCKS}/{block}"),
        ):
            if param in body and body[param] != self._etag(target):
                raise RedfishError(428, messages.base("PreconditionFailed"))
        add, remove = ([block], []) if action == ADD_ACTION else ([], [block])

        def result() -> tuple[int, dict[str, Any]]:
            return 200, {"@Message.ExtendedInfo": [messages.base("Success")]}

        return await self._change(request, host, add, remove, result, body)

    async def _patch_system(self, request: web.Request, host: str) -> web.StreamResponse:
        body = await self._body(request)
        if not body:
            raise RedfishError(400, messages.base("NoOperation"))
        for key in body:
            if key != "Links":
                raise RedfishError(400, messages.base("PropertyNotWritable", key))
        links = body["Links"]
        if not isinstance(links, dict):
            raise RedfishError(
                400, messages.base("PropertyValueTypeError", json.dumps(links), "Links")
            )
        for key in links:
            if key != "ResourceBlocks":
                raise RedfishError(400, messages.base("PropertyNotWritable", f"Links/{key}"))
        refs = links.get("ResourceBlocks")
        if not isinstance(refs, list) or not all(
            isinstance(r, dict) and isinstance(r.get("@odata.id"), str) for r in refs
        ):
            raise RedfishError(
                400,
                messages.base("PropertyValueTypeError", json.dumps(refs), "Links/ResourceBlocks"),
            )
        system_uri = f"{SYSTEMS}/{host}"
        if_match = request.headers.get("If-Match")
        async with self.lock:
            if if_match and if_match != "*" and if_match != self._etag(system_uri):
                raise RedfishError(412, messages.base("PreconditionFailed"))
            add, remove = state.diff_links(
                self.topology, self.comp, host, [r["@odata.id"] for r in refs]
            )

        def result() -> tuple[int, dict[str, Any]]:
            payload = resources.render(self.view(), system_uri)
            assert payload is not None
            return 200, payload

        return await self._change(request, host, add, remove, result, body)

    async def _change(
        self,
        request: web.Request,
        host: str,
        add: list[str],
        remove: list[str],
        result: Callable[[], tuple[int, dict[str, Any]]],
        body: dict[str, Any],
    ) -> web.StreamResponse:
        failing = self.faults.decide(request.method, request.path, faults_mod.TASK_KINDS).rule
        async with self.lock:
            state.check_change(self.topology, self.comp, host, add, remove)
            if self.config.async_polls <= 0 and failing is None:
                state.apply_change(self.comp, host, add, remove)
                self.composed(host, add, remove)
                await self.save()
                log.info("composition changed", system=host, added=add, removed=remove)
                status, payload = result()
                headers = {}
                if request.method == "PATCH":
                    headers["ETag"] = etag_of(payload)
                return _json(status, payload, headers)
            state.reserve(self.comp, host, add, remove)

            async def complete() -> tuple[int, dict[str, Any]]:
                state.apply_change(self.comp, host, add, remove)
                self.composed(host, add, remove)
                await self.save()
                log.info("composition changed (task)", system=host, added=add, removed=remove)
                return result()

            def abort() -> None:
                state.release(self.comp, add, remove)
                log.info("composition task failed", system=host, added=add, removed=remove)

            task = self.tasks.create(
                request.method,
                request.path,
                body,
                polls=max(self.config.async_polls, 1),
                complete=complete,
                abort=abort,
                failure=[messages.base("OperationFailed")] if failing is not None else None,
            )
        asyncio.get_running_loop().call_later(
            self.config.task_seconds, lambda: asyncio.ensure_future(self._finish_unpolled(task))
        )
        if failing is not None:
            log.info("fault injected", kind="task_failure", rule=failing.id, task=task.id)
        log.info("composition task started", task=task.id, system=host, added=add, removed=remove)
        return _json(
            202,
            tasks.render(task),
            {"Location": task.monitor_uri, "Retry-After": str(self.config.retry_after)},
        )

    async def _finish_unpolled(self, task: tasks.Task) -> None:
        async with self.lock:
            if not task.done:
                await self.tasks.finish(task)
                log.info("composition task ended unpolled", task=task.id, state=task.state)

    # ---- admin ---------------------------------------------------------------------------

    async def _admin_json(self, request: web.Request) -> Any:
        """The body of an admin request; BodyRefused (answered by the middleware) if none."""
        raw = await read_json(request)
        if raw is None:
            raise BodyRefused(400, "a JSON body is required")
        return raw

    def _admin_error(self, text: str, status: int = 400) -> web.Response:
        return web.json_response({"error": text}, status=status)

    async def _admin_faults_get(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"rules": self.faults.to_json()})

    async def _admin_faults_post(self, request: web.Request) -> web.StreamResponse:
        raw = await self._admin_json(request)
        try:
            rule = self.faults.add(raw)
        except faults_mod.FaultError as exc:
            return self._admin_error(str(exc))
        log.info("fault rule added", rule=rule.to_json())
        return web.json_response(rule.to_json(), status=201)

    async def _admin_faults_put(self, request: web.Request) -> web.StreamResponse:
        raw = await self._admin_json(request)
        rules = raw.get("rules") if isinstance(raw, dict) else raw
        try:
            self.faults.replace(rules)
        except faults_mod.FaultError as exc:
            return self._admin_error(str(exc))
        log.info("fault rules replaced", count=len(self.faults.rules))
        return web.json_response({"rules": self.faults.to_json()})

    async def _admin_faults_clear(self, request: web.Request) -> web.StreamResponse:
        self.faults.clear()
        return web.Response(status=204)

    async def _admin_faults_delete(self, request: web.Request) -> web.StreamResponse:
        if not self.faults.remove(request.match_info["id"]):
            return self._admin_error("no such rule", 404)
        return web.Response(status=204)

    def _config_json(self) -> dict[str, Any]:
        return {
            "async_polls": self.config.async_polls,
            "retry_after": self.config.retry_after,
            "task_seconds": self.config.task_seconds,
        }

    async def _admin_config_get(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self._config_json())

    async def _admin_config_patch(self, request: web.Request) -> web.StreamResponse:
        raw = await self._admin_json(request)
        if not isinstance(raw, dict):
            return self._admin_error("expected a JSON object")
        for key, value in raw.items():
            if key not in ("async_polls", "retry_after", "task_seconds"):
                return self._admin_error(f"unknown setting {key!r}")
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                return self._admin_error(f"{key} must be a non-negative integer")
            if value > limits.SETTING_MAX[key]:
                return self._admin_error(f"{key} must be at most {limits.SETTING_MAX[key]}")
        self.config.async_polls = raw.get("async_polls", self.config.async_polls)
        self.config.retry_after = raw.get("retry_after", self.config.retry_after)
        self.config.task_seconds = raw.get("task_seconds", self.config.task_seconds)
        log.info("config changed", **self._config_json())
        return web.json_response(self._config_json())

    async def _admin_block_status(self, request: web.Request) -> web.StreamResponse:
        block = request.match_info["id"]
        if block not in self.topology.blocks:
            return self._admin_error("no such block", 404)
        status = None
        if request.method == "PUT":
            try:
                status = block_status.parse(await self._admin_json(request))
            except block_status.StatusError as exc:
                return self._admin_error(str(exc))
        async with self.lock:
            if status is None or status == block_status.OK:
                self.comp.status.pop(block, None)
            else:
                self.comp.status[block] = status
        log.info("block status set", block=block, status=status or block_status.OK)
        return web.json_response(status or block_status.OK)

    async def _admin_state(self, request: web.Request) -> web.StreamResponse:
        async with self.lock:
            return web.json_response(self.dump())

    async def _admin_reset(self, request: web.Request) -> web.StreamResponse:
        async with self.lock:
            self.tasks.clear()
            self.comp = Composition()
            self.faults.clear()
            (self.config.async_polls, self.config.retry_after, self.config.task_seconds) = (
                self._initial
            )
            await self.save()
        log.info("reset")
        return web.json_response(self.dump())

    async def _admin_healthz(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True})


# Every client of a test run shares the loopback address: the process's connection
# budget bounds the emulator, rather than a small per-peer share.
LIMITS = ServerLimits(per_peer=4096, max_body=limits.MAX_BODY)


async def start(emulator: Emulator, host: str, port: int) -> tuple[HttpServer, str]:
    """Start serving behind ``LIMITS`` (composable_dra.serving); return the server
    (``await server.cleanup()`` to stop) and base URL."""
    server = await serve_app(emulator.app(), host, port, name="fabric_emulator", limits=LIMITS)
    bound_host = f"[{server.host}]" if ":" in server.host else server.host
    return server, f"http://{bound_host}:{server.port}"
