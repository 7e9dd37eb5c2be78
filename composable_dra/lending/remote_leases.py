"""The donor's lease API as its callers and the donor both see it (docs/architecture.md,
"The remote-GPU fallback").

A lent GPU's lease is opened by the lease controller (in the scaler) and its credentials
are collected by the consumer node's plugin at prepare time. Both talk HTTPS to the donor
(TLS verified against ``--donor-ca-file``, or the system trust store), and both prove who
they are with a service-account token: the controller's its own, for one donor's audience
(TokenRequest); the plugin's the one the kubelet projects into its pod, bound to the pod
and so to its node, for the donors' common audience (``--lease-token-file``), so that the
donor's TokenReview names the node and no other node can make one like it. Shared here:
the wire models, the typed errors, where a donor's API is (``DonorDirectory``), and the
synchronous client both callers use (``LeaseClient``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from composable_dra.k8s import kube_json
from composable_dra.model.gpu_config import QosConfig

if TYPE_CHECKING:  # the CLI imports this module for its flags: no client libraries then
    from composable_dra.k8s.kube import Kube

JSON = dict[str, Any]

REMOTE_READY = "RemoteGPUReady"
REMOTE_FAILED = "RemoteGPUFailed"
REMOTE_SUFFIX = "-remote"  # the plugin's name for a GPU's remote-lease device
API_PREFIX = "/v1/leases"
# The TokenReview extras that name the node and the pod a bound token was issued for.
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
# The audience of the plugins' projected token, which every donor accepts: a pod's
# projected tokens are fixed in its spec, and a DaemonSet's spec cannot name every donor.
# The donors share one trust domain anyway (one token key): docs/architecture.md.
DONORS_AUDIENCE = "composable.dra.io/remote-gpu-donors"
MAX_TOKEN = 8192  # bytes of a bearer token, either way
MAX_BODY = 16 << 10  # bytes of a request or response body, either way
TOKEN_SECONDS = 600  # the shortest lifetime TokenRequest grants

_UID = r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$"
_LABEL = r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$"
_SUBDOMAIN = r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)*$"


def is_node_name(value: str) -> bool:
    """A DNS-1123 subdomain, as node names are: safe in a URL host and a file name."""
    return len(value) <= 253 and re.fullmatch(_SUBDOMAIN, value) is not None


def audience(donor_node: str) -> str:
    """The token audience of one donor's lease API: a token for A is refused by B."""
    return f"composable.dra.io/remote-gpu-donor/{donor_node}"


def allocation_node(allocation: JSON) -> str | None:
    """The one node a bindsToNode allocation's nodeSelector names (None: not one)."""
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for req in (term.get("matchFields") or []) + (term.get("matchExpressions") or []):
            values = req.get("values") or []
            if (
                req.get("key") in ("metadata.name", "kubernetes.io/hostname")
                and req.get("operator") == "In"
                and len(values) == 1
            ):
                return str(values[0])
    return None


# -- wire models -------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class OpenLease(_Model):
    """POST /v1/leases: a lease for one allocated remote device of one claim."""

    claim_uid: str = Field(alias="claimUID", pattern=_UID)
    namespace: str = Field(pattern=_LABEL, max_length=63)
    name: str = Field(pattern=_SUBDOMAIN, max_length=253)
    device: str = Field(pattern=_LABEL, max_length=63)
    node: str = Field(pattern=_SUBDOMAIN, max_length=253)  # the consumer


class LeaseInfo(_Model):
    """A lease as the API reports it: no credentials."""

    lease: int = Field(ge=1, lt=2**53)
    donor: str  # the data plane's donor name (the tokens' ``donor``)
    endpoint: str  # host:port of the data plane
    # The donor process that holds the lease: a restarted donor has another, and none
    # of the leases before (a lease missing from the same instance was closed by a caller).
    instance: str
    claim_uid: str = Field(alias="claimUID")
    namespace: str
    name: str
    device: str
    node: str


class LeaseList(_Model):
    instance: str
    items: list[LeaseInfo] = Field(default_factory=list)


STATUS_PATH = "/status"  # GET API_PREFIX + STATUS_PATH: the donor's lending status


class FunctionModel(_Model):
    """A function's latency model as the donor fitted it: ``service + growth x (k - 1)``
    seconds per call with k concurrent leases, from ``samples`` measurements (0: its
    ``--latency-model`` prior)."""

    samples: int = Field(ge=0)
    service_s: float = Field(alias="serviceSeconds", ge=0, allow_inf_nan=False)
    growth_s: float = Field(alias="growthSeconds", ge=0, allow_inf_nan=False)


class LeasedDevice(_Model):
    """A remote device leased now, with the QoS profile its claim declared (None: none)."""

    device: str = Field(pattern=_LABEL, max_length=63)
    qos: QosConfig | None = None


class LendingStatus(_Model):
    """GET /v1/leases/status: what the donor measures, for the plugin that publishes its
    remote devices (the link-busy taint, the lease counter)."""

    instance: str = Field(max_length=64)
    leases: int = Field(ge=0, le=1 << 20)  # open now
    window_s: float = Field(alias="windowSeconds", gt=0, allow_inf_nan=False)
    link_bytes_per_second: float = Field(alias="linkBytesPerSecond", ge=0, allow_inf_nan=False)
    # None: the donor was given no link bandwidth, so its load is unknown.
    link_capacity: float | None = Field(
        default=None, alias="linkCapacityBytesPerSecond", gt=0, allow_inf_nan=False
    )
    link_load: float | None = Field(default=None, alias="linkLoad", ge=0, le=1)
    # The most leases every admitted SLO allows (``slo.lease_capacity``).
    lease_capacity: int = Field(alias="leaseCapacity", ge=0, le=1 << 20)
    functions: dict[str, FunctionModel] = Field(default_factory=dict, max_length=256)
    # The leases' devices and profiles: the plugin keeps their host headroom, and offers
    # the QoS headroom on a device no one holds (``qos.closed``).
    leased: list[LeasedDevice] = Field(default_factory=list, max_length=1 << 12)


class Code(StrEnum):
    BAD_REQUEST = "bad_request"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    TOO_LARGE = "too_large"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"
    # The lease would break an admitted latency SLO (or its own): not offered now.
    SLO_UNMET = "slo_unmet"


STATUS: dict[Code, int] = {
    Code.BAD_REQUEST: 400,
    Code.UNAUTHENTICATED: 401,
    Code.FORBIDDEN: 403,
    Code.NOT_FOUND: 404,
    Code.CONFLICT: 409,
    Code.TOO_LARGE: 413,
    Code.UNAVAILABLE: 503,
    Code.INTERNAL: 500,
    Code.SLO_UNMET: 409,
}


class ErrorBody(_Model):
    code: Code
    message: str


class LeaseAPIError(Exception):
    """What the donor refused (``code``), or ``UNAVAILABLE`` when it was not reached;
    ``retry_after``: seconds to wait before asking again, when known (the retry policy
    honours it)."""

    def __init__(self, code: Code, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return STATUS[self.code]

    @property
    def retryable(self) -> bool:
        return self.code in (Code.UNAVAILABLE, Code.INTERNAL)


# -- where a donor's API is -----------------------------------------------------------


@dataclass(frozen=True)
class DonorDirectory:
    """A donor node's lease API URL: an explicit one, else the template with ``{node}``."""

    urls: Mapping[str, str] = field(default_factory=dict)
    template: str = "https://{node}:7471"

    def url(self, node: str) -> str:
        if not is_node_name(node):
            raise LeaseAPIError(Code.BAD_REQUEST, f"{node!r} is not a node name")
        found = self.urls.get(node)
        return (found or self.template.format(node=node)).rstrip("/")

    @classmethod
    def parse(cls, items: list[str], template: str) -> DonorDirectory:
        urls: dict[str, str] = {}
        for item in items:
            node, sep, url = item.partition("=")
            if not sep or not is_node_name(node) or not url.startswith(("https://", "http://")):
                raise ValueError(f"--donor-api {item!r}: expected NODE=https://HOST:PORT")
            urls[node] = url
        if "{node}" not in template:
            raise ValueError(f"--donor-api-template {template!r} has no {{node}}")
        return cls(urls, template)


def add_client_arguments(p: argparse.ArgumentParser, role: str, token_file: bool = False) -> None:
    """Flags of a lease API caller: the scaler's lease controller (its service account),
    or with ``token_file`` the plugin (its pod's projected token)."""
    g = p.add_argument_group("remote GPU leases", f"how the {role} reaches donors' lease APIs")
    g.add_argument(
        "--donor-api",
        action="append",
        default=[],
        metavar="NODE=URL",
        help="a donor node's lease API (repeatable); others: --donor-api-template",
    )
    g.add_argument(
        "--donor-api-template",
        default=os.environ.get("DONOR_API_TEMPLATE", "https://{node}:7471"),
        help="a donor's lease API URL, {node} the donor node (env DONOR_API_TEMPLATE)",
    )
    g.add_argument(
        "--donor-ca-file",
        default=os.environ.get("DONOR_CA_FILE"),
        help="CA bundle that signs the donors' certificates (default: system trust store)",
    )
    if token_file:
        g.add_argument(
            "--lease-token-file",
            default=os.environ.get("LEASE_TOKEN_FILE"),
            metavar="PATH",
            help=f"the {role}'s pod's projected service-account token for the audience "
            f"{DONORS_AUDIENCE}, which proves its node to donors; re-read at each call, as "
            "the kubelet renews it (env LEASE_TOKEN_FILE; unset: remote GPU leases off)",
        )
        return
    g.add_argument(
        "--lease-service-account",
        default=os.environ.get("LEASE_SERVICE_ACCOUNT"),
        metavar="NAMESPACE/NAME",
        help=f"the {role}'s service account, whose tokens prove it to donors "
        "(env LEASE_SERVICE_ACCOUNT; unset: remote GPU leases off)",
    )


def client_from_args(args: argparse.Namespace, kube: Kube | None = None) -> LeaseClient:
    """The client ``add_client_arguments``' flags describe: tokens from
    ``--lease-token-file``, else requested for ``--lease-service-account`` (with ``kube``).
    SystemExit on bad flags."""
    tokens: Tokens
    try:
        directory = DonorDirectory.parse(args.donor_api, args.donor_api_template)
        if getattr(args, "lease_token_file", None):
            tokens = FileToken(Path(args.lease_token_file))
        else:
            assert kube is not None
            tokens = TokenSource(kube, *parse_service_account(args.lease_service_account))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return LeaseClient(directory, tokens, args.donor_ca_file)


def parse_service_account(value: str) -> tuple[str, str]:
    ns, sep, name = value.partition("/")
    if not sep or not re.fullmatch(_LABEL, ns) or not re.fullmatch(_SUBDOMAIN, name):
        raise ValueError(f"service account {value!r}: expected NAMESPACE/NAME")
    return ns, name


# -- tokens ------------------------------------------------------------------------------


class Tokens(Protocol):
    def token(self, aud: str) -> str: ...


class FileToken:
    """The token in a file the kubelet keeps fresh (a projected service-account token),
    read at each call: the same token whatever donor's audience is asked, since it is for
    the donors' common one (``DONORS_AUDIENCE``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def token(self, aud: str) -> str:
        try:
            raw = self.path.read_bytes()[: MAX_TOKEN + 1]
        except OSError as exc:
            raise LeaseAPIError(
                Code.UNAVAILABLE, f"no lease token at {self.path}: {exc.strerror}"
            ) from None
        token = raw.strip()
        if not token or len(token) > MAX_TOKEN or not token.isascii() or b" " in token:
            raise LeaseAPIError(Code.UNAVAILABLE, f"no usable lease token at {self.path}")
        return token.decode("ascii")


class TokenSource:
    """Service-account tokens for donors' audiences (TokenRequest), cached until 80% of
    their lifetime: the lease controller's."""

    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self._kube = kube
        self._namespace, self._name = namespace, name
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, str]] = {}

    def token(self, aud: str) -> str:
        from composable_dra.k8s.kube import KubeError, path

        with self._lock:
            cached = self._cache.get(aud)
            if cached is not None and cached[0] > time.monotonic():
                return cached[1]
        spec: JSON = {"audiences": [aud], "expirationSeconds": TOKEN_SECONDS}
        try:
            out = self._kube.create(
                path(
                    "v1",
                    "serviceaccounts",
                    self._name,
                    namespace=self._namespace,
                    subresource="token",
                ),
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
            )
        except KubeError as exc:
            raise LeaseAPIError(
                Code.UNAVAILABLE, f"no token for {self._namespace}/{self._name}: {exc.reason}"
            ) from None
        token = str((out.get("status") or {}).get("token") or "")
        if not token:
            raise LeaseAPIError(Code.INTERNAL, "TokenRequest returned no token")
        with self._lock:
            self._cache[aud] = (time.monotonic() + TOKEN_SECONDS * 0.8, token)
        return token


# -- the client ------------------------------------------------------------------------


class LeaseClient:
    """Synchronous calls to donors' lease APIs, one HTTPS pool for all of them."""

    def __init__(
        self,
        directory: DonorDirectory,
        tokens: Tokens,
        ca_file: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        import urllib3

        self.directory = directory
        self._tokens = tokens
        kw: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED"}
        if ca_file:
            kw["ca_certs"] = ca_file
        self._http = urllib3.PoolManager(
            num_pools=16, maxsize=4, timeout=urllib3.Timeout(total=timeout), retries=False, **kw
        )

    def _call(self, donor: str, method: str, suffix: str, body: JSON | None = None) -> Any:
        import urllib3

        url = self.directory.url(donor) + API_PREFIX + suffix
        headers = {
            "Authorization": f"Bearer {self._tokens.token(audience(donor))}",
            "Accept": "application/json",
        }
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            resp = self._http.request(
                method, url, body=data, headers=headers, preload_content=False
            )
        except urllib3.exceptions.HTTPError as exc:
            raise LeaseAPIError(
                Code.UNAVAILABLE, f"donor {donor} unreachable: {type(exc).__name__}"
            ) from None
        try:
            raw = resp.read(MAX_BODY + 1)
        except urllib3.exceptions.HTTPError as exc:
            raise LeaseAPIError(Code.UNAVAILABLE, f"donor {donor}: {type(exc).__name__}") from None
        finally:
            resp.release_conn()
        if len(raw) > MAX_BODY:
            raise LeaseAPIError(Code.INTERNAL, f"donor {donor} answered more than {MAX_BODY} B")
        if resp.status == 204:
            return None
        try:
            # A deep answer is cut (never RecursionError), then refused by the models.
            payload = kube_json.loads(raw)
        except ValueError:
            payload = None
        if 200 <= resp.status < 300:
            return payload
        after = retry_after(resp.headers.get("Retry-After"))
        try:
            err = ErrorBody.model_validate(payload)
        except ValidationError:
            code = next((c for c, s in STATUS.items() if s == resp.status), Code.INTERNAL)
            raise LeaseAPIError(code, f"donor {donor} answered HTTP {resp.status}", after) from None
        raise LeaseAPIError(err.code, err.message, after)

    def open(self, donor: str, request: OpenLease) -> LeaseInfo:
        out = self._call(donor, "POST", "", request.model_dump(by_alias=True))
        return _parse(LeaseInfo, out, donor)

    def list(self, donor: str) -> LeaseList:
        return _parse(LeaseList, self._call(donor, "GET", ""), donor)

    def status(self, donor: str) -> LendingStatus:
        return parse_status(self._call(donor, "GET", STATUS_PATH), donor)

    def credentials(self, donor: str, lease: int) -> JSON:
        """The lease's token JSON: a secret, never logged or stored in the API."""
        out = self._call(donor, "POST", f"/{int(lease)}/credentials")
        if not isinstance(out, dict):
            raise LeaseAPIError(Code.INTERNAL, f"donor {donor} sent no credentials")
        return out

    def close(self, donor: str, lease: int) -> None:
        """Close the lease; one already gone is no error."""
        try:
            self._call(donor, "DELETE", f"/{int(lease)}")
        except LeaseAPIError as exc:
            if exc.code is not Code.NOT_FOUND:
                raise


_M = TypeVar("_M", bound=BaseModel)


def retry_after(value: str | None) -> float | None:
    """A Retry-After of whole seconds (the form the donor sends), capped at an hour;
    None for anything else."""
    if value is None or not (value.isascii() and value.isdigit() and len(value) <= 6):
        return None
    return float(min(int(value), 3600))


def parse_status(payload: Any, donor: str) -> LendingStatus:
    """A donor's lending status; LeaseAPIError INTERNAL when malformed."""
    return _parse(LendingStatus, payload, donor)


def _parse(model: type[_M], payload: Any, donor: str) -> _M:
    try:
        return model.model_validate(payload)
    except ValidationError:
        raise LeaseAPIError(Code.INTERNAL, f"donor {donor} sent a malformed answer") from None
