"""A small JSON client for the Kubernetes API, on top of the official client's transport.

The official client's typed models drop fields they do not know (docs/architecture.md,
Rules for the Kubernetes API), so every component reads and writes plain dicts through this module:
GET, LIST, WATCH, create, merge patch, server-side apply and delete, with typed errors.
Authentication, TLS and kubeconfig handling stay with the official client; requests go
through its public ``ApiClient.param_serialize`` and ``call_api`` (what its generated and
``kubernetes.dynamic`` APIs call), never its private names.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any, Protocol

from kubernetes import client, config
from prometheus_client import Counter

from composable_dra.k8s import kube_json
from composable_dra.process import logs

JSON = dict[str, Any]

log = logs.get(__name__)

CUT_OBJECTS = Counter(
    "composable_dra_objects_cut_total",
    "Objects read from the API server with a part nested deeper than the suite reads, cut",
    ["kind"],
)


class KubeError(Exception):
    """An error status from the API server."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    """409: a create of an existing object, or a stale resourceVersion."""


class Gone(KubeError):
    """410: the resourceVersion a watch started from is too old; relist."""


_ERRORS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone}


def segment(value: str) -> str:
    """``value`` as one URL path segment; ValueError for the dot segments.

    '.' and '..' survive percent-encoding and are collapsed by URL normalisation (the
    API server refuses such names too).
    """
    if value in (".", ".."):
        raise ValueError(f"{value!r} cannot be an object name")
    return urllib.parse.quote(value, safe="")


def path(
    api_version: str,
    plural: str,
    name: str | None = None,
    *,
    namespace: str | None = None,
    subresource: str | None = None,
) -> str:
    """The URL path of a collection or object: path("resource.k8s.io/v1", "resourceclaims", ...).

    ``name`` and ``namespace`` may come from outside (a claim reference, a spec): each is
    one percent-encoded path segment, so no value can change which path is requested.
    """
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    parts = [prefix]
    if namespace:
        parts.append(f"namespaces/{segment(namespace)}")
    parts.append(plural)
    if name:
        parts.append(segment(name))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


class Kube:
    """Plain-dict access to the API server."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api

    @classmethod
    def from_config(
        cls,
        kubeconfig: str | None = None,
        pool_size: int | None = None,
        user_agent: str | None = None,
    ) -> Kube:
        """From a kubeconfig file, else the in-cluster service account.

        ``pool_size``: connections kept open, for a process that calls from many threads
        (the client's default, cores x 5, would reopen a TLS connection per extra call).
        ``user_agent``: who is calling, as the API server's audit log and metrics show it
        (``composable-dra/<component>``); the client's generic one otherwise.
        """
        if kubeconfig:
            cfg = client.Configuration()
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config()
            cfg = client.Configuration.get_default_copy()
        if pool_size:
            cfg.connection_pool_maxsize = pool_size
        api = client.ApiClient(cfg)
        if user_agent:
            api.user_agent = user_agent
        return cls(api)

    # -- requests --------------------------------------------------------------------

    def _send(
        self,
        method: str,
        url_path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = 30,
    ) -> Any:
        q = [(k, v) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # The client's public request path, as its generated and dynamic APIs take it:
        # param_serialize adds the configuration's credentials and encodes the query
        # (booleans as true/false); call_api sends (the transport serialises the body as
        # JSON for every content type we send) and returns the unread response.
        method, url, headers, body, post = self.api.param_serialize(
            method,
            url_path,
            query_params=q,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api.call_api(method, url, headers, body, post, _request_timeout=timeout)

    def request(self, method: str, url_path: str, **kwargs: Any) -> JSON:
        resp = self._send(method, url_path, **kwargs)
        raw = resp.read()
        status = resp.status
        try:
            payload: JSON = self._decode(raw) if raw else {}
        except ValueError:
            # Not every error is a Status object: an unknown API group answers a plain
            # "404 page not found".
            if 200 <= status < 300:
                raise
            payload = {"message": raw.decode(errors="replace").strip()}
        if not 200 <= status < 300:
            err = _ERRORS.get(status, KubeError)
            raise err(status, str(payload.get("reason", "")), str(payload.get("message", raw)))
        return payload

    @staticmethod
    def _decode(raw: bytes) -> Any:
        """A body or watch event, within the API server's limits (composable_dra/k8s/kube_json.py):
        a part nested too deep is cut, and each object with a cut is counted and logged."""
        value, cut = kube_json.decode(raw)
        if cut:
            _report_cut(value)
        return value

    def get(self, url_path: str, **query: Any) -> JSON:
        """An object, or a list of them (with query parameters such as labelSelector)."""
        return self.request("GET", url_path, query=query)

    def get_or_none(self, url_path: str) -> JSON | None:
        try:
            return self.get(url_path)
        except NotFound:
            return None

    def create(self, url_path: str, body: JSON) -> JSON:
        return self.request("POST", url_path, body=body)

    def replace(self, url_path: str, body: JSON, field_manager: str) -> JSON:
        """PUT: the whole object as ``body``; with ``metadata.resourceVersion`` set, a
        Conflict if the object changed since."""
        return self.request("PUT", url_path, body=body, query={"fieldManager": field_manager})

    def merge_patch(self, url_path: str, body: JSON) -> JSON:
        return self.request(
            "PATCH", url_path, body=body, content_type="application/merge-patch+json"
        )

    def json_patch(self, url_path: str, ops: list[JSON]) -> JSON:
        return self.request("PATCH", url_path, body=ops, content_type="application/json-patch+json")

    def apply(self, url_path: str, body: JSON, field_manager: str, force: bool = True) -> JSON:
        """Server-side apply: we own exactly the fields we send."""
        return self.request(
            "PATCH",
            url_path,
            body=body,
            query={"fieldManager": field_manager, "force": force},
            content_type="application/apply-patch+yaml",
        )

    def delete(self, url_path: str, body: JSON | None = None, **query: Any) -> JSON | None:
        """Delete; an object already gone is not an error (returns None)."""
        try:
            return self.request("DELETE", url_path, body=body, query=query)
        except NotFound:
            return None

    def watch(
        self, url_path: str, resource_version: str, timeout_seconds: int = 60, **query: Any
    ) -> Iterator[JSON]:
        """Stream watch events (dicts with type and object), bookmarks included.

        Raises Gone when the resourceVersion is too old: the caller relists.
        """
        resp = self._send(
            "GET",
            url_path,
            query={
                **query,
                "watch": True,
                "resourceVersion": resource_version,
                "allowWatchBookmarks": True,
                "timeoutSeconds": timeout_seconds,
            },
            timeout=(10, timeout_seconds + 10),
        )
        raw = resp.response
        try:
            if resp.status != 200:
                payload = kube_json.loads(raw.read() or b"{}")
                err = _ERRORS.get(resp.status, KubeError)
                raise err(resp.status, payload.get("reason", ""), payload.get("message", ""))
            buffer = b""
            for chunk in raw.stream(64 * 1024, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event: JSON = self._decode(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object", {})
                        code = int(status.get("code", 500))
                        err = _ERRORS.get(code, KubeError)
                        raise err(code, status.get("reason", ""), status.get("message", ""))
                    yield event
        finally:
            raw.release_conn()


def _report_cut(value: Any) -> None:
    """Count and log each object of a body (a LIST's items, a watch event's object, an
    object) that was cut. Rare: only a body with a cut is walked."""
    if not isinstance(value, dict):
        return
    list_kind = str(value.get("kind") or "")
    if isinstance(value.get("items"), list):
        objects, kind = value["items"], list_kind.removesuffix("List")
    elif isinstance(value.get("object"), dict):
        objects, kind = [value["object"]], ""
    else:
        objects, kind = [value], ""
    for obj in objects:
        if not isinstance(obj, dict):
            continue
        paths = kube_json.cut_paths(obj)
        if not paths:
            continue
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        obj_kind = kind or str(obj.get("kind") or "")
        CUT_OBJECTS.labels(obj_kind).inc()
        log.warning(
            "object nested too deep: parts cut, not read",
            kind=obj_kind,
            object=f"{meta.get('namespace') or ''}/{meta.get('name') or ''}".lstrip("/"),
            uid=meta.get("uid"),
            paths=paths,
            max_depth=kube_json.MAX_DEPTH,
        )


LIST_PAGE = 500  # objects per page of a list (client-go's pager uses the same)


class Getter(Protocol):
    def get(self, url_path: str, **query: Any) -> JSON: ...


def list_pages(kube: Getter, url_path: str, page: int = LIST_PAGE, **query: Any) -> Iterator[JSON]:
    """A LIST's answers, ``page`` objects each (``limit``/``continue``: one snapshot, as a
    single LIST would be), so that a reader can cut each page down before the next is
    read. The last answer's ``metadata.resourceVersion`` is the list's."""
    token = ""
    while True:
        body = kube.get(url_path, **query, limit=page, **({"continue": token} if token else {}))
        yield body
        token = str((body.get("metadata") or {}).get("continue") or "")
        if not token:
            return
