"""Claims nested as deep as the API server accepts, and the official client's transport
faked below ``Kube`` (tests/unit/composable_dra/test_kube_deep.py, test_kube_json.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from composable_dra.k8s.kube import Kube

DRIVER = "gpu.composable.dra.io"
OPAQUE_MAX = 10 * 1024  # resource.OpaqueParametersMaxLength in v1.37.1
BODY_DEPTH_MAX = 10_000  # sigs.k8s.io/json's nesting limit for a request body


def nested(depth: int, shape: str = "[") -> str:
    """A JSON value ``depth`` levels deep: each level an array, or for ``{`` an object."""
    opens = "".join('{"k":' if shape[i % len(shape)] == "{" else "[" for i in range(depth))
    closes = "".join("}" if shape[i % len(shape)] == "{" else "]" for i in reversed(range(depth)))
    return opens + "1" + closes


def worst_parameters() -> str:
    """The deepest opaque parameters the API server accepts: an object (validateRawExtension
    wants one) holding arrays to the 10 KiB limit."""
    levels = (OPAQUE_MAX - len('{"a":1}')) // 2
    raw = '{"a":' + "[" * levels + "1" + "]" * levels + "}"
    assert len(raw) <= OPAQUE_MAX
    return raw


def claim(name: str, parameters: str) -> str:
    """A claim as the API server sends it, ``parameters`` in its spec and its allocation."""
    config = (
        '[{"requests":["gpu"],"opaque":{"driver":"%s","parameters":%s}}]' % (DRIVER, parameters)  # noqa: UP031
    )
    alloc = config.replace('[{"requests"', '[{"source":"FromClaim","requests"')
    return (
        f'{{"metadata":{{"name":"{name}","namespace":"other","uid":"uid-{name}","resourceVersion":"7"}},'
        '"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu"}}],'
        f'"config":{config}}}}},"status":{{"allocation":{{"devices":{{"results":[{{"request":"gpu",'
        f'"driver":"{DRIVER}","pool":"donor","device":"gpu-0-remote"}}],"config":{alloc}}}}}}}}}'
    )


GOOD = '{"apiVersion":"gpu.composable.dra.io/v1alpha1","kind":"GpuConfig","sharing":"Shared"}'


def claim_list(*items: str) -> bytes:
    return (
        '{{"kind":"ResourceClaimList","apiVersion":"resource.k8s.io/v1",'
        '"metadata":{{"resourceVersion":"9"}},"items":[{}]}}'.format(",".join(items))
    ).encode()


# -- the official client's transport, faked below Kube ------------------------------------


class _Stream:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, amt: int, decode_content: bool = True) -> Iterator[bytes]:
        for i in range(0, len(self.body), amt):
            yield self.body[i : i + amt]

    def read(self) -> bytes:
        return self.body

    def release_conn(self) -> None:
        pass


class _Response:
    def __init__(self, body: bytes, status: int = 200) -> None:
        self.body, self.status, self.response = body, status, _Stream(body)

    def read(self) -> bytes:
        return self.body


class FakeApi:
    """ApiClient's public request path: LISTs answer ``listed``, watches stream ``events``
    once, then end."""

    def __init__(self, listed: bytes, events: list[bytes] | None = None) -> None:
        self.listed = listed
        self.events = list(events or [])

    def param_serialize(self, method: str, url: str, **kw: Any) -> tuple[Any, ...]:
        return method, url, kw["header_params"], kw["body"], kw["query_params"]

    def call_api(
        self, method: str, url: str, headers: Any, body: Any, query: Any, **kw: Any
    ) -> Any:
        if ("watch", True) in query:
            lines, self.events = self.events, []
            return _Response(b"".join(line + b"\n" for line in lines))
        return _Response(self.listed)


def kube(listed: bytes, events: list[bytes] | None = None) -> Kube:
    return Kube(FakeApi(listed, events))
