"""The donor's lease API: who may open a lease, and who may have its credentials.

HTTPS (aiohttp), JSON, served beside the data plane by ``remote-gpu-donor`` with
``--lease-api-listen``. Every call carries a service-account token for this donor's
audience (the controller's) or the donors' common one (the plugins' projected token),
checked with a TokenReview (``remote_gpu/token_reviews.py``; who may do what:
``remote_gpu/identity.py``):

- ``POST /v1/leases`` (the lease controller's account only): open a lease for one
  allocated remote device of one claim and its consumer node; idempotent per claim UID
  and device (a claim for several remote devices holds a lease for each).
  Answers the lease id and the data plane's endpoint: no credentials.
- ``GET /v1/leases`` (the controller): every open lease, to resync after a restart.
- ``POST /v1/leases/{id}/credentials`` (the plugin's account, with a token bound to a
  pod on the lease's consumer node): the lease's token JSON, once the claim itself (read from the
  API server) shows that device allocated to that node.
- ``DELETE /v1/leases/{id}`` (the controller, or the consumer node's plugin): close it;
  its token opens nothing any more and a connection using it ends.
- ``GET /v1/leases/status`` (the controller, or the plugin of the donor's own node): what
  the donor measures (``remote_gpu/lending.py``): its link's load and the lease capacity
  that keeps every admitted latency SLO. The plugin publishes both on the remote devices.

With a ``LendingMonitor``, opening a lease reads the claim's ``latencySLO`` (our driver's
opaque config) and refuses the lease (``slo_unmet``) when it would break an admitted SLO
or its own.

Leases live in memory: a restarted donor has none, and the data plane admits only the
leases this API opened (``LeaseBook.is_open``), so a token from before the restart is
refused. Refusals are typed (``composable_dra.lending.remote_leases.Code``) with their HTTP
status; bodies are capped at ``MAX_BODY`` bytes; nothing from a request names a file.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import urllib3
from aiohttp import web
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from composable_dra.k8s.kube import JSON, Kube, KubeError, NotFound, path
from composable_dra.lending.remote_leases import (
    API_PREFIX,
    DONORS_AUDIENCE,
    MAX_BODY,
    MAX_TOKEN,
    STATUS,
    STATUS_PATH,
    Code,
    ErrorBody,
    LeaseAPIError,
    LeasedDevice,
    LeaseInfo,
    LeaseList,
    OpenLease,
    allocation_node,
    audience,
)
from composable_dra.model.gpu_config import ConfigError, QosConfig
from composable_dra.process import logs
from composable_dra.serving.http import HttpServer, serve_app
from composable_dra.serving.limits import Budget, ServerLimits
from remote_gpu import slo
from remote_gpu.claim_config import lease_of_claim, qos_of_claim
from remote_gpu.identity import Identity, identity_of, is_plugin_on
from remote_gpu.lending import LendingMonitor
from remote_gpu.token_reviews import REVIEW_SECONDS, Reviewer, Reviews
from remote_gpu.tokens import Token, issue

log = logs.get(__name__)

MAX_LEASES = 1024  # leases one donor holds at most; the link's knee is far below
API_DOWN_RETRY_S = 5.0  # Retry-After while the API server does not answer
_LEASE_ID_MAX = 2**53  # fits a JSON number exactly, as the claim status carries it


class ClaimSource(Protocol):
    def claim(self, namespace: str, name: str) -> JSON | None: ...


# What the Kubernetes client raises when the API server is not reached or answers no
# status: its own ApiException (TLS failures), urllib3's errors once its retries are
# spent, a socket's OSError.
_UNREACHED = (ApiException, urllib3.exceptions.HTTPError, OSError)


class KubeReviewer:
    """TokenReview and claim reads against the API server (blocking: run off the loop).
    An API server that does not answer is UNAVAILABLE, with a Retry-After."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube

    def review(self, token: str, audiences: tuple[str, ...]) -> Identity:
        try:
            out = self._kube.create(
                path("authentication.k8s.io/v1", "tokenreviews"),
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenReview",
                    "spec": {"token": token, "audiences": list(audiences)},
                },
            )
        except KubeError as exc:
            raise _unavailable(f"TokenReview failed: {exc.reason}") from None
        except _UNREACHED as exc:
            raise _unavailable(f"TokenReview failed: {type(exc).__name__}") from None
        return identity_of(out.get("status") or {}, audiences)

    def claim(self, namespace: str, name: str) -> JSON | None:
        try:
            return self._kube.get(
                path("resource.k8s.io/v1", "resourceclaims", name, namespace=namespace)
            )
        except NotFound:
            return None
        except KubeError as exc:
            raise _unavailable(f"cannot read the claim: {exc.reason}") from None
        except _UNREACHED as exc:
            raise _unavailable(f"cannot read the claim: {type(exc).__name__}") from None


def _unavailable(message: str) -> LeaseAPIError:
    return LeaseAPIError(Code.UNAVAILABLE, message, retry_after=API_DOWN_RETRY_S)


# -- the leases ------------------------------------------------------------------------


@dataclass
class Lease:
    info: LeaseInfo
    token: Token = field(repr=False)
    slo: slo.Lease = field(default_factory=lambda: slo.Lease(""))  # its claim's latency SLO
    qos: QosConfig | None = None  # its claim's QoS profile


# Why a candidate lease may not join the admitted ones (None: it may).
Refusal = Callable[[list[slo.Lease], slo.Lease], str | None]


class LeaseBook:
    """The open leases, by id and by (claim UID, device); thread-safe (the data plane
    asks too)."""

    def __init__(self, donor: str, endpoint: str, secret: bytes, ttl_s: float) -> None:
        self.donor, self.endpoint = donor, endpoint
        self._secret = secret
        self._ttl = ttl_s
        self._lock = threading.Lock()
        self._by_id: dict[int, Lease] = {}
        self._by_device: dict[tuple[str, str], int] = {}
        self.instance = secrets.token_hex(8)  # this process's: leases die with it

    def open(
        self,
        req: OpenLease,
        want: slo.Lease | None = None,
        refusal: Refusal | None = None,
        profile: QosConfig | None = None,
    ) -> tuple[Lease, bool]:
        """The lease of the claim's device (and True when new). CONFLICT when it is for
        another node: that allocation ended, and its lease must close first.
        SLO_UNMET when ``refusal`` says the new lease (``want``) may not join the open
        ones (asked under the book's lock, so two opens cannot both take the last place)."""
        want = want or slo.Lease("")
        with self._lock:
            known = self._by_device.get((req.claim_uid, req.device))
            if known is not None:
                lease = self._by_id[known]
                i = lease.info
                if (i.namespace, i.name, i.node) != (req.namespace, req.name, req.node):
                    raise LeaseAPIError(
                        Code.CONFLICT,
                        f"claim {req.claim_uid} holds lease {i.lease} for {i.device} on {i.node}",
                    )
                return lease, False
            if len(self._by_id) >= MAX_LEASES:
                raise LeaseAPIError(Code.UNAVAILABLE, f"{MAX_LEASES} leases open already")
            if refusal is not None:
                why = refusal([lease.slo for lease in self._by_id.values()], want)
                if why is not None:
                    raise LeaseAPIError(Code.SLO_UNMET, why)
            lease_id = 0
            while lease_id == 0 or lease_id in self._by_id:
                lease_id = secrets.randbelow(_LEASE_ID_MAX - 1) + 1
            info = LeaseInfo(
                lease=lease_id,
                donor=self.donor,
                endpoint=self.endpoint,
                instance=self.instance,
                claim_uid=req.claim_uid,
                namespace=req.namespace,
                name=req.name,
                device=req.device,
                node=req.node,
            )
            lease = Lease(info, issue(self._secret, lease_id, self.donor, self._ttl), want, profile)
            self._by_id[lease_id] = lease
            self._by_device[(req.claim_uid, req.device)] = lease_id
            return lease, True

    def get(self, lease_id: int) -> Lease | None:
        with self._lock:
            return self._by_id.get(lease_id)

    def close(self, lease_id: int) -> Lease | None:
        with self._lock:
            lease = self._by_id.pop(lease_id, None)
            if lease is not None:
                self._by_device.pop((lease.info.claim_uid, lease.info.device), None)
            return lease

    def items(self) -> list[LeaseInfo]:
        with self._lock:
            return [lease.info for lease in self._by_id.values()]

    def admitted(self) -> list[slo.Lease]:
        with self._lock:
            return [lease.slo for lease in self._by_id.values()]

    def leased(self) -> list[LeasedDevice]:
        with self._lock:
            return [LeasedDevice(device=x.info.device, qos=x.qos) for x in self._by_id.values()]

    def is_open(self, lease_id: int) -> bool:
        """The data plane's gate: only leases this API opened may connect."""
        with self._lock:
            return lease_id in self._by_id


# -- pure checks ----------------------------------------------------------------------


def claim_problem(claim: JSON | None, info: LeaseInfo, driver: str, pool: str) -> str | None:
    """Why ``claim`` does not back this lease, or None: the same claim (UID), allocated
    with this donor's device, to the lease's consumer node."""
    if claim is None:
        return "the claim is gone"
    if (claim.get("metadata") or {}).get("uid") != info.claim_uid:
        return "the claim was replaced"
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    if not any(
        (r.get("driver"), r.get("pool"), r.get("device")) == (driver, pool, info.device)
        for r in results
    ):
        return f"the claim is not allocated {pool}/{info.device}"
    if allocation_node(allocation) != info.node:
        return f"the claim's allocation is not for node {info.node}"
    return None


def parse_lease_id(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 16):
        raise LeaseAPIError(Code.BAD_REQUEST, "a lease id is a decimal number")
    value = int(text)
    if not 1 <= value < _LEASE_ID_MAX:
        raise LeaseAPIError(Code.BAD_REQUEST, "lease id out of range")
    return value


def parse_open(body: bytes) -> OpenLease:
    if len(body) > MAX_BODY:
        raise LeaseAPIError(Code.TOO_LARGE, f"a body of at most {MAX_BODY} bytes")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise LeaseAPIError(Code.BAD_REQUEST, "the body is not JSON") from None
    try:
        return OpenLease.model_validate(data)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) or "body" for e in exc.errors()})
        raise LeaseAPIError(Code.BAD_REQUEST, f"invalid fields: {', '.join(fields)}") from None


# RFC 6750's b64token: what a service-account token (a JWT) is made of. Anything else,
# bytes that are not UTF-8 among them, is no token and costs no TokenReview.
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*")


def bearer(header: str | None) -> str:
    scheme, _, token = (header or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or len(token) > MAX_TOKEN or not _B64TOKEN.fullmatch(token):
        raise LeaseAPIError(Code.UNAUTHENTICATED, "a bearer token is required")
    return token


# -- the server -----------------------------------------------------------------------

LIMITS = ServerLimits(max_body=MAX_BODY)  # the default bounds (composable_dra.serving)


@dataclass(frozen=True)
class LeaseAPIConfig:
    node: str  # the donor's node: its pool's name, and the tokens' audience
    driver: str
    controller: str  # username of the lease controller (system:serviceaccount:NS:NAME)
    plugin: str  # username of the consumer nodes' plugins


class LeaseAPI:
    """The HTTP handlers over a :class:`LeaseBook`; ``on_close`` ends the data plane's
    side of a closed lease (its connection, its token)."""

    def __init__(
        self,
        config: LeaseAPIConfig,
        book: LeaseBook,
        reviewer: Reviewer,
        claims: ClaimSource,
        on_close: Callable[[int, float], None] = lambda _lease, _expiry: None,
        monitor: LendingMonitor | None = None,
        review_ttl: float = REVIEW_SECONDS,
    ) -> None:
        self.config, self.book = config, book
        self._claims = claims
        self.monitor = monitor
        self._on_close = on_close
        # This donor's own audience (the controller's tokens), and the plugins' projected
        # token's, which every donor accepts.
        audiences = (audience(config.node), DONORS_AUDIENCE)
        self._reviews = Reviews(reviewer, audiences, ttl=review_ttl)

    def set_on_close(self, on_close: Callable[[int, float], None]) -> None:
        self._on_close = on_close

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors])
        app.router.add_post(API_PREFIX, self._open)
        app.router.add_get(API_PREFIX, self._list)
        app.router.add_get(API_PREFIX + STATUS_PATH, self._status)
        app.router.add_post(API_PREFIX + "/{lease}/credentials", self._credentials)
        app.router.add_delete(API_PREFIX + "/{lease}", self._close)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except LeaseAPIError as exc:
            return _error(exc.code, exc.message, exc.retry_after)
        except web.HTTPRequestEntityTooLarge:
            return _error(Code.TOO_LARGE, f"a body of at most {MAX_BODY} bytes")
        except web.HTTPException as exc:  # no such route or method
            code = next((c for c, s in STATUS.items() if s == exc.status), Code.NOT_FOUND)
            return _error(code, exc.reason)
        except ConnectionError:
            raise  # the peer is gone, or its body was late (serving's limits): no answer
        except Exception:
            log.exception("lease API request failed", path=request.path)
            return _error(Code.INTERNAL, "internal error")

    async def _who(self, request: web.Request) -> Identity:
        return await self._reviews.who(bearer(request.headers.get("Authorization")))

    def _controller(self, who: Identity) -> None:
        if who.user != self.config.controller:
            raise LeaseAPIError(Code.FORBIDDEN, f"{who.user} may not open or list leases")

    def _lease(self, request: web.Request) -> Lease:
        lease = self.book.get(parse_lease_id(request.match_info["lease"]))
        if lease is None:
            raise LeaseAPIError(Code.NOT_FOUND, "no such lease")
        return lease

    async def _open(self, request: web.Request) -> web.Response:
        body = await request.read()
        self._controller(await self._who(request))
        req = parse_open(body)
        want, refusal, profile = None, None, None
        if self.monitor is not None:
            (want, profile), refusal = await self._wants_of(req), self.monitor.refusal
        lease, created = self.book.open(req, want, refusal, profile)
        if created:
            log.info(
                "lease opened for claim",
                lease=lease.info.lease,
                claim=f"{req.namespace}/{req.name}",
                device=req.device,
                node=req.node,
            )
        return _json(lease.info.model_dump(by_alias=True), 201 if created else 200)

    async def _wants_of(self, req: OpenLease) -> tuple[slo.Lease, QosConfig | None]:
        """The latency SLO and the QoS profile the claim declares for this device (none:
        a lease without them)."""
        loop = asyncio.get_running_loop()
        claim = await loop.run_in_executor(None, self._claims.claim, req.namespace, req.name)
        if claim is None or (claim.get("metadata") or {}).get("uid") != req.claim_uid:
            return slo.Lease(""), None
        driver, pool = self.config.driver, self.config.node
        try:
            found = lease_of_claim(claim, driver, pool, req.device)
            profile = qos_of_claim(claim, driver, pool, req.device)
        except ConfigError as exc:
            why = f"claim {req.namespace}/{req.name}: {exc}"
            raise LeaseAPIError(Code.BAD_REQUEST, why) from None
        return found or slo.Lease(""), profile

    async def _status(self, request: web.Request) -> web.Response:
        who = await self._who(request)
        if who.user != self.config.controller and not is_plugin_on(
            who, self.config.plugin, self.config.node
        ):
            raise LeaseAPIError(
                Code.FORBIDDEN, f"only the plugin of node {self.config.node} reads its status"
            )
        if self.monitor is None:
            raise LeaseAPIError(Code.NOT_FOUND, "this donor measures nothing for lending")
        status = self.monitor.status(self.book.instance, self.book.admitted())
        status = status.model_copy(update={"leased": self.book.leased()})
        return _json(status.model_dump(by_alias=True))

    async def _list(self, request: web.Request) -> web.Response:
        self._controller(await self._who(request))
        return _json(
            LeaseList(instance=self.book.instance, items=self.book.items()).model_dump(
                by_alias=True
            )
        )

    async def _credentials(self, request: web.Request) -> web.Response:
        who = await self._who(request)
        lease = self._lease(request)
        info = lease.info
        if not is_plugin_on(who, self.config.plugin, info.node):
            raise LeaseAPIError(
                Code.FORBIDDEN, f"only the plugin of node {info.node} may have this lease's token"
            )
        loop = asyncio.get_running_loop()
        claim = await loop.run_in_executor(None, self._claims.claim, info.namespace, info.name)
        why = claim_problem(claim, info, self.config.driver, self.config.node)
        if why is not None:
            raise LeaseAPIError(Code.FORBIDDEN, why)
        log.info("lease credentials handed out", lease=info.lease, node=info.node)
        return _json(lease.token.to_json())

    async def _close(self, request: web.Request) -> web.Response:
        who = await self._who(request)
        lease = self._lease(request)
        if who.user != self.config.controller and not is_plugin_on(
            who, self.config.plugin, lease.info.node
        ):
            raise LeaseAPIError(Code.FORBIDDEN, f"{who.user} may not close this lease")
        closed = self.book.close(lease.info.lease)
        if closed is not None:
            self._on_close(closed.info.lease, closed.token.expiry)
            log.info("lease closed by its owner", lease=closed.info.lease, by=who.user)
        return web.Response(status=204)


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status, headers={"Cache-Control": "no-store"})


def _error(code: Code, message: str, retry_after: float | None = None) -> web.Response:
    response = _json(ErrorBody(code=code, message=message).model_dump(mode="json"), STATUS[code])
    if retry_after is not None:
        response.headers["Retry-After"] = str(max(1, round(retry_after)))
    return response


def server_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


async def serve(
    api: LeaseAPI,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    limits: ServerLimits = LIMITS,
    budget: Budget | None = None,
) -> tuple[HttpServer, int]:
    """Start serving behind ``limits`` (composable_dra.serving: connections per peer and
    per process, header and body deadlines); the server (``cleanup()`` stops it) and the
    bound port."""
    server = await serve_app(
        api.app(),
        host,
        port,
        name="lease_api",
        limits=limits,
        ssl_context=ssl_context,
        budget=budget,
    )
    log.info("lease API listening", address=f"{host}:{server.port}", tls=ssl_context is not None)
    return server, int(server.port)
