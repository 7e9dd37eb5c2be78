"""Fabric objects to backends: credentials, TLS material, node-to-host mapping."""

from __future__ import annotations

import base64
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from api.labels import DNS_SUBDOMAIN_RE
from api.v1alpha1 import API_VERSION, FabricSpec, NodeMapping
from composable_dra.fabric.backend import FabricBackend, Host, host_by_uuid
from composable_dra.fabric.connection import DEFAULT_CONNECTIONS, Connection
from composable_dra.fabric.fsas import FsasCredentials, FsasFabricManagerBackend
from composable_dra.fabric.redfish import RedfishCompositionBackend
from composable_dra.fabric.redfish_zones import RedfishZonesBackend
from composable_dra.k8s.kube import JSON, Kube, NotFound, path
from composable_dra.model.names import normalize_uuid


class FabricConfigError(Exception):
    """The Fabric object or its Secrets are not usable; an operator must fix them."""


class FabricGoneError(FabricConfigError):
    """The Fabric object does not exist (any more)."""


def _secret_value(secret: JSON, key: str) -> str:
    data = secret.get("data", {})
    if key not in data:
        name = f"{secret['metadata']['namespace']}/{secret['metadata']['name']}"
        raise FabricConfigError(f"Secret {name} has no key {key!r}")
    return base64.b64decode(data[key]).decode()


def uuid_index(hosts: Mapping[str, Host]) -> dict[str, str]:
    """Normalized system UUID -> host id (the first host of a UUID, as host_by_uuid finds
    it): mapping every node of a large cluster looks each one up instead of scanning every
    host per node, which was quadratic (docs/attach-flow.md, Scale)."""
    index: dict[str, str] = {}
    for h in hosts.values():
        index.setdefault(normalize_uuid(h.uuid), h.id)
    return index


def node_mapping_fields(node: JSON) -> JSON:
    """What ``host_for_node`` (and a deletion check) reads of a Node: an Informer of
    1,000 Nodes keeps these (``keep=``) rather than their status (images, conditions),
    most of a real Node's size."""
    meta = node.get("metadata") or {}
    keys = ("name", "uid", "resourceVersion", "deletionTimestamp", "labels", "annotations")
    system_uuid = ((node.get("status") or {}).get("nodeInfo") or {}).get("systemUUID")
    return {
        "metadata": {k: meta[k] for k in keys if k in meta},
        "spec": {k: v for k, v in (node.get("spec") or {}).items() if k == "providerID"},
        "status": {"nodeInfo": {"systemUUID": system_uuid}} if system_uuid else {},
    }


def host_for_node(
    node: JSON,
    mapping: NodeMapping,
    hosts: Mapping[str, Host],
    by_uuid: Mapping[str, str] | None = None,
) -> str | None:
    """The fabric host id a node runs on, or None when the node is not on this fabric.

    ``by_uuid``: ``uuid_index(hosts)``, for callers that map many nodes.
    """
    if mapping.by == "systemUUID":
        system_uuid = node.get("status", {}).get("nodeInfo", {}).get("systemUUID", "")
        if not system_uuid:
            return None
        if by_uuid is not None:
            return by_uuid.get(normalize_uuid(system_uuid))
        host = host_by_uuid(hosts, system_uuid)
        return host.id if host else None
    if mapping.by == "providerID":
        provider_id = node.get("spec", {}).get("providerID", "")
        for host_id in hosts:
            if provider_id and provider_id.rstrip("/").endswith(f"/{host_id}"):
                return host_id
        return None
    value = node.get("metadata", {}).get("annotations", {}).get(mapping.annotation or "")
    return value if value in hosts else None


def host_nodes(
    nodes: Iterable[JSON], mapping: NodeMapping, hosts: Mapping[str, Host]
) -> dict[str, list[str]]:
    """fabric host id -> names of the (live) nodes that run on it, per the Fabric's
    nodeMapping: one pass over the nodes, each looked up in ``uuid_index``."""
    out: dict[str, list[str]] = {}
    by_uuid = uuid_index(hosts)
    for node in nodes:
        if (node.get("metadata") or {}).get("deletionTimestamp"):
            continue
        host = host_for_node(node, mapping, hosts, by_uuid)
        if host:
            out.setdefault(host, []).append(node["metadata"]["name"])
    return out


class SecretKeys:
    """A credentials Secret's keys, decoded when asked for (a missing key: a clear error)."""

    def __init__(self, secret: JSON) -> None:
        self._secret = secret

    def __getitem__(self, key: str) -> str:
        return _secret_value(self._secret, key)

    def get(self, key: str, default: str = "") -> str:
        return self[key] if key in self._secret.get("data", {}) else default

    def __repr__(self) -> str:  # never print a secret
        return "SecretKeys(...)"


class BackendFactory(Protocol):
    """Builds a Fabric's backend; ``connections``: how many it keeps open to the fabric
    (the most concurrent calls its process makes)."""

    def __call__(
        self,
        spec: FabricSpec,
        creds: SecretKeys,
        ca_file: str | None,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> FabricBackend: ...


def _connection(spec: FabricSpec, ca_file: str | None, connections: int) -> Connection:
    """The Fabric's TLS settings, with the CA written out, and the process's pool size."""
    return Connection(ca_file, spec.insecure_skip_tls_verify, connections=connections)


def _redfish(
    backend: type[RedfishCompositionBackend] | type[RedfishZonesBackend],
) -> BackendFactory:
    """The factory of a Redfish backend: endpoint, basic credentials, TLS settings."""

    def make(
        spec: FabricSpec,
        creds: SecretKeys,
        ca_file: str | None,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> FabricBackend:
        return backend(
            spec.endpoint,
            creds["username"],
            creds["password"],
            connection=_connection(spec, ca_file, connections),
        )

    return make


def _fsas(
    spec: FabricSpec,
    creds: SecretKeys,
    ca_file: str | None,
    connections: int = DEFAULT_CONNECTIONS,
) -> FabricBackend:
    if spec.fsas is None:  # the CRD's rule requires it; an old object may lack it
        raise FabricConfigError("backend fsas-fm needs spec.fsas (tenantUUID, realm)")
    by_model = spec.fsas.attach_by == "model"
    if by_model and not spec.fsas.models:
        raise FabricConfigError("fsas attachBy model needs spec.fsas.models (what to count)")
    return FsasFabricManagerBackend(
        spec.endpoint,
        FsasCredentials(
            creds["client_id"], creds["client_secret"], creds.get("username"), creds.get("password")
        ),
        tenant_uuid=spec.fsas.tenant_uuid,
        realm=spec.fsas.realm,
        connection=_connection(spec, ca_file, connections),
        attach_by_model=by_model,
        models=tuple(spec.fsas.models),
    )


FACTORIES: dict[str, BackendFactory] = {
    "redfish-composition": _redfish(RedfishCompositionBackend),
    "redfish-zones": _redfish(RedfishZonesBackend),
    "fsas-fm": _fsas,
}


def spec_version(fabric: JSON) -> str:
    """Changes when the Fabric's spec does: its generation (a status write, the operator's
    each poll, leaves it), or its resourceVersion for an object that has none."""
    meta = fabric.get("metadata") or {}
    generation = meta.get("generation")
    return f"g{generation}" if generation is not None else f"rv{meta.get('resourceVersion')}"


class Fabrics:
    """Backends per Fabric, rebuilt when the Fabric or its Secrets change.

    The Fabric and its Secrets are re-read at most every ``max_age`` seconds: every
    resource's daemon asks on every pass, and twenty concurrent attaches would otherwise
    read the same three objects sixty times over. A change is seen within ``max_age``.
    """

    def __init__(
        self,
        kube: Kube,
        factories: dict[str, BackendFactory] | None = None,
        max_age: float = 1.0,
        connections: int = DEFAULT_CONNECTIONS,
    ) -> None:
        self.kube = kube
        self.factories = factories or FACTORIES
        self.max_age = max_age
        self.connections = connections  # per backend: the process's concurrent calls
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[str, ...], FabricSpec, FabricBackend]] = {}
        self._checked: dict[str, float] = {}  # name -> monotonic time of the last read
        self._reading: dict[str, threading.Lock] = {}  # name -> held while it is read
        # Made at the first Fabric with a CA, removed by close() (or when collected).
        self._ca_dir: tempfile.TemporaryDirectory[str] | None = None

    def get(self, name: str) -> tuple[FabricSpec, FabricBackend]:
        """The Fabric's spec and a backend for it (blocking: call from a thread).

        One read at a time per Fabric: callers that find the cache old while a read is
        under way wait for that read instead of making their own (a hundred attaches in
        flight ask at once)."""
        with self._lock:
            fresh = self._fresh(name)
            reading = self._reading.setdefault(name, threading.Lock())
        if fresh is not None:
            return fresh
        with reading:
            with self._lock:
                fresh = self._fresh(name)
            if fresh is not None:
                return fresh  # read by the caller we waited for
            return self._read(name)

    def _fresh(self, name: str) -> tuple[FabricSpec, FabricBackend] | None:
        """The cached spec and backend while younger than max_age (hold ``_lock``)."""
        cached = self._cache.get(name)
        if cached and time.monotonic() - self._checked.get(name, -1e9) < self.max_age:
            return cached[1], cached[2]
        return None

    def _read(self, name: str) -> tuple[FabricSpec, FabricBackend]:
        read_at = time.monotonic()
        fabric = self.kube.get_or_none(path(API_VERSION, "fabrics", name))
        if fabric is None:
            with self._lock:
                self._checked.pop(name, None)
            raise FabricGoneError(f"Fabric {name} not found")
        spec = FabricSpec.model_validate(fabric["spec"])
        creds = self._secret(spec.credentials_secret.namespace, spec.credentials_secret.name)
        ca = self._secret(spec.ca_secret.namespace, spec.ca_secret.name) if spec.ca_secret else None
        version = (
            spec_version(fabric),
            creds["metadata"]["resourceVersion"],
            ca["metadata"]["resourceVersion"] if ca else "",
        )
        with self._lock:
            cached = self._cache.get(name)
            if cached and cached[0] == version:
                self._checked[name] = read_at
                return cached[1], cached[2]
        factory = self.factories.get(spec.backend)
        if factory is None:
            raise FabricConfigError(f"backend {spec.backend!r} is not supported by this operator")
        ca_file = None
        if ca is not None:
            ca_file = self._write_ca(name, _secret_value(ca, "ca.crt"))
        backend = factory(spec, SecretKeys(creds), ca_file, self.connections)
        with self._lock:
            old = self._cache.get(name)
            self._cache[name] = (version, spec, backend)
            self._checked[name] = read_at
        if old:
            old[2].close()
        return spec, backend

    def _write_ca(self, name: str, pem: str) -> str:
        """The CA bundle as a file the TLS client can load, named for its Fabric."""
        if not DNS_SUBDOMAIN_RE.fullmatch(name):  # the API server's rule; a path part
            raise FabricConfigError(f"Fabric name {name!r} is not a DNS subdomain")
        with self._lock:
            if self._ca_dir is None:
                self._ca_dir = tempfile.TemporaryDirectory(prefix="composable-fabric-ca-")
            ca_path = Path(self._ca_dir.name) / f"{name}.crt"
        ca_path.write_text(pem)
        return str(ca_path)

    def _secret(self, namespace: str, name: str) -> JSON:
        try:
            return self.kube.get(path("v1", "secrets", name, namespace=namespace))
        except NotFound:
            raise FabricConfigError(f"Secret {namespace}/{name} not found") from None

    def close(self) -> None:
        with self._lock:
            for _, _, backend in self._cache.values():
                backend.close()
            self._cache.clear()
            if self._ca_dir is not None:
                self._ca_dir.cleanup()
                self._ca_dir = None


def condition_status(status: dict[str, Any], kind: str) -> str | None:
    for c in status.get("conditions", []) or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return None
