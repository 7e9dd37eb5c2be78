"""The donor's lease API: who may open, fetch and close a lease, and the data plane's gate.

The handlers run on a real aiohttp server over TLS (a throwaway CA), called by the real
``LeaseClient``; the TokenReview and the claim read are fakes (this module's unit tests;
the end-to-end test uses the API server's).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import urllib3
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.lending.remote_leases import (
    MAX_BODY,
    Code,
    DonorDirectory,
    LeaseAPIError,
    LeaseClient,
    OpenLease,
    audience,
)
from remote_gpu import tokens
from remote_gpu.client import RemoteGPU
from remote_gpu.donor import DonorConfig
from remote_gpu.errors import AuthError, RemoteGPUError
from remote_gpu.identity import Identity
from remote_gpu.lease_api import (
    LeaseAPI,
    LeaseAPIConfig,
    LeaseBook,
    bearer,
    claim_problem,
    parse_lease_id,
    parse_open,
    serve,
    server_context,
)
from testbed.pki import CertificateAuthority

from .conftest import ALLOW, SECRET, start_donor, stop_donor

DRIVER = "gpu.composable.dra.io"
DONOR = "node-a"
CONTROLLER = "system:serviceaccount:cdra:scaler"
PLUGIN = "system:serviceaccount:cdra:plugin"
FUZZ = settings(max_examples=150)


IDS = {
    "controller": Identity(CONTROLLER),
    "plugin-c": Identity(PLUGIN, "node-c", "plugin-pod-c"),
    "plugin-d": Identity(PLUGIN, "node-d", "plugin-pod-d"),
    "plugin-unbound": Identity(PLUGIN),
    # Bound to node-c's Node object, not to a pod there: whoever may create the account's
    # tokens can make one of those for any node.
    "plugin-c-node-bound": Identity(PLUGIN, "node-c"),
    "stranger": Identity("system:serviceaccount:other:sa", "node-c", "pod-c"),
}


class Reviewer:
    """TokenReview stand-in: token -> identity (only for this donor's audiences). A token
    named ``slow-...`` is answered only once ``release`` is set (a slow API server)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self._lock = threading.Lock()
        self.hanging = 0  # slow reviews under way now
        self.most_hanging = 0  # and at most

    def review(self, token: str, audiences: tuple[str, ...]) -> Identity:
        self.calls.append(token)
        if token.startswith("slow-"):
            with self._lock:
                self.hanging += 1
                self.most_hanging = max(self.most_hanging, self.hanging)
            self.release.wait(30)
            with self._lock:
                self.hanging -= 1
        if token == "api-down":
            raise LeaseAPIError(Code.UNAVAILABLE, "TokenReview failed")
        if audience(DONOR) not in audiences or token not in IDS:
            raise LeaseAPIError(Code.UNAUTHENTICATED, "the token does not authenticate")
        return IDS[token]


class Claims:
    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.items.get((namespace, name))


def allocated_claim(uid: str, device: str = "gpu-0-remote", node: str = "node-c") -> dict[str, Any]:
    return {
        "metadata": {"name": "c1", "namespace": "ns", "uid": uid},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": DONOR, "device": device}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
        },
    }


def request(uid: str = "uid-1", device: str = "gpu-0-remote", node: str = "node-c") -> OpenLease:
    return OpenLease(claim_uid=uid, namespace="ns", name="c1", device=device, node=node)


class As:
    def __init__(self, token: str) -> None:
        self.value = token

    def token(self, aud: str) -> str:
        return self.value


class Served:
    def __init__(self, tmp: Path, reviewer: Any = None, **kw: Any) -> None:
        ca = CertificateAuthority(tmp / "pki")
        pair = ca.issue("donor", "donor", ips=("127.0.0.1",), server=True)
        self.ca = str(ca.cert_path)
        self.book = LeaseBook("donor-a", "127.0.0.1:7470", SECRET, 60.0)
        self.claims = Claims()
        self.closed: list[int] = []
        self.reviewer = reviewer or Reviewer()
        self.api = LeaseAPI(
            LeaseAPIConfig(DONOR, DRIVER, CONTROLLER, PLUGIN),
            self.book,
            self.reviewer,
            self.claims,
            lambda lease, _expiry: self.closed.append(lease),
            **kw,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        ctx = server_context(str(pair.cert), str(pair.key))
        self.runner, port = asyncio.run_coroutine_threadsafe(
            serve(self.api, "127.0.0.1", 0, ctx), self.loop
        ).result(10)
        self.url = f"https://127.0.0.1:{port}"

    def client(self, token: str, ca: str | None = "default") -> LeaseClient:
        return LeaseClient(
            DonorDirectory({DONOR: self.url}), As(token), self.ca if ca == "default" else ca
        )

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    s = Served(tmp_path_factory.mktemp("lease-api"))
    yield s
    s.close()


def refused(call: Any, code: Code) -> None:
    with pytest.raises(LeaseAPIError) as err:
        call()
    assert err.value.code is code, err.value


def test_only_the_controller_opens_and_lists_and_opening_is_idempotent(served: Served) -> None:
    refused(lambda: served.client("nobody").open(DONOR, request("o1")), Code.UNAUTHENTICATED)
    refused(lambda: served.client("plugin-c").open(DONOR, request("o1")), Code.FORBIDDEN)
    refused(lambda: served.client("plugin-c").list(DONOR), Code.FORBIDDEN)
    controller = served.client("controller")
    first = controller.open(DONOR, request("o1"))
    assert controller.open(DONOR, request("o1")) == first
    assert first.endpoint == "127.0.0.1:7470" and first.donor == "donor-a"
    # The same device of the claim for another node: that allocation must end first.
    refused(lambda: controller.open(DONOR, request("o1", node="node-x")), Code.CONFLICT)
    assert first.lease in {i.lease for i in controller.list(DONOR).items}


def test_a_claim_with_several_remote_devices_gets_a_lease_for_each(served: Served) -> None:
    controller = served.client("controller")
    leases = [controller.open(DONOR, request("m1", device=f"gpu-{i}-remote")) for i in range(3)]
    assert len({i.lease for i in leases}) == 3
    assert controller.open(DONOR, request("m1", device="gpu-1-remote")) == leases[1]
    controller.close(DONOR, leases[0].lease)
    # Closing one leaves the others, and that device may have a lease again.
    listed = {i.lease for i in controller.list(DONOR).items}
    assert {leases[1].lease, leases[2].lease} <= listed and leases[0].lease not in listed
    assert controller.open(DONOR, request("m1", device="gpu-0-remote")).lease != leases[0].lease


def test_credentials_only_for_the_consumer_nodes_plugin_and_a_real_allocation(
    served: Served,
) -> None:
    info = served.client("controller").open(DONOR, request("k1"))
    for who in ("controller", "plugin-d", "plugin-unbound", "plugin-c-node-bound", "stranger"):
        refused(lambda w=who: served.client(w).credentials(DONOR, info.lease), Code.FORBIDDEN)
    # The consumer's plugin, but the claim does not show that allocation (yet).
    refused(lambda: served.client("plugin-c").credentials(DONOR, info.lease), Code.FORBIDDEN)
    served.claims.items[("ns", "c1")] = allocated_claim("k1", node="node-d")
    refused(lambda: served.client("plugin-c").credentials(DONOR, info.lease), Code.FORBIDDEN)
    served.claims.items[("ns", "c1")] = allocated_claim("k1")
    # The allocation is real now; still not for another node's plugin, nor for a token
    # bound to the consumer's Node object rather than to a pod there.
    for who in ("plugin-d", "plugin-c-node-bound"):
        refused(lambda w=who: served.client(w).credentials(DONOR, info.lease), Code.FORBIDDEN)
    token = tokens.Token.from_json(served.client("plugin-c").credentials(DONOR, info.lease))
    assert token.lease == info.lease and token.donor == "donor-a"
    tokens.verify(SECRET, token, "donor-a")
    refused(lambda: served.client("plugin-c").credentials(DONOR, 12345), Code.NOT_FOUND)


def test_close_by_the_controller_or_the_consumer_plugin(served: Served) -> None:
    controller = served.client("controller")
    a = controller.open(DONOR, request("x1"))
    b = controller.open(DONOR, request("x2"))
    refused(lambda: served.client("plugin-d").close(DONOR, a.lease), Code.FORBIDDEN)
    refused(lambda: served.client("plugin-c-node-bound").close(DONOR, a.lease), Code.FORBIDDEN)
    served.client("plugin-c").close(DONOR, a.lease)
    controller.close(DONOR, b.lease)
    controller.close(DONOR, b.lease)  # gone already: no error
    assert {a.lease, b.lease} <= set(served.closed)
    assert not {a.lease, b.lease} & {i.lease for i in controller.list(DONOR).items}


def test_tls_is_verified_by_default(served: Served) -> None:
    # No CA given: the system trust store, which does not know the donor's CA.
    refused(lambda: served.client("controller", ca=None).list(DONOR), Code.UNAVAILABLE)


def test_bad_requests_are_typed(served: Served) -> None:
    http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=served.ca, retries=False)
    auth = {"Authorization": "Bearer controller", "Content-Type": "application/json"}
    cases = [
        ("POST", "/v1/leases", b"{not json", 400),
        ("POST", "/v1/leases", b'{"claimUID": "../x"}', 400),
        ("POST", "/v1/leases", b"x" * (MAX_BODY + 1), 413),
        ("DELETE", "/v1/leases/..%2f..%2fetc", b"", 400),
        ("DELETE", "/v1/leases/99999999999999999999", b"", 400),
        ("GET", "/v1/other", b"", 404),
    ]
    for method, url, body, status in cases:
        resp = http.request(method, served.url + url, body=body, headers=auth)
        assert resp.status == status, (method, url, resp.data)
        assert resp.json()["code"] in {c.value for c in Code}
    resp = http.request("GET", served.url + "/v1/leases")  # no token at all
    assert resp.status == 401


def test_token_reviews_are_reused_briefly_but_not_an_api_server_failure(served: Served) -> None:
    before = served.reviewer.calls.count("plugin-d")
    for _ in range(3):
        refused(lambda: served.client("forged-1").list(DONOR), Code.UNAUTHENTICATED)
        refused(lambda: served.client("plugin-d").list(DONOR), Code.FORBIDDEN)
        refused(lambda: served.client("api-down").list(DONOR), Code.UNAVAILABLE)
    assert served.reviewer.calls.count("forged-1") == 1
    assert served.reviewer.calls.count("plugin-d") - before <= 1  # cached by another test?
    assert served.reviewer.calls.count("api-down") == 3


def test_claim_problem() -> None:
    info = served_info()
    assert claim_problem(None, info, DRIVER, DONOR) == "the claim is gone"
    assert claim_problem(allocated_claim("other"), info, DRIVER, DONOR) == "the claim was replaced"
    wrong_device = allocated_claim("u", device="gpu-1-remote")
    assert "not allocated" in (claim_problem(wrong_device, info, DRIVER, DONOR) or "")
    assert "node-c" in (claim_problem(allocated_claim("u", node="x"), info, DRIVER, DONOR) or "")
    assert claim_problem(allocated_claim("u"), info, DRIVER, DONOR) is None
    assert claim_problem(allocated_claim("u"), info, DRIVER, "node-b") is not None


def served_info() -> Any:
    book = LeaseBook("donor-a", "e:1", SECRET, 60.0)
    info = book.open(request("u"))[0].info
    assert info.instance == book.instance
    return info


FIELDS = st.sampled_from(["claimUID", "namespace", "name", "device", "node", "x"])
BODIES = st.binary(max_size=512) | st.dictionaries(
    FIELDS, st.text(max_size=80) | st.integers(), max_size=6
).map(lambda d: json.dumps(d).encode())


@FUZZ
@given(BODIES)
def test_parse_open_fuzz(body: bytes) -> None:
    try:
        req = parse_open(body)
    except LeaseAPIError as exc:
        assert exc.code in (Code.BAD_REQUEST, Code.TOO_LARGE)
        return
    for value in (req.claim_uid, req.namespace, req.name, req.device, req.node):
        assert "/" not in value and ".." not in value and value


@FUZZ
@given(st.text(max_size=40))
def test_parse_lease_id_and_bearer_fuzz(text: str) -> None:
    try:
        assert 1 <= parse_lease_id(text) < 2**53
    except LeaseAPIError as exc:
        assert exc.code is Code.BAD_REQUEST
    try:
        assert bearer(text)
    except LeaseAPIError as exc:
        assert exc.code is Code.UNAUTHENTICATED


def test_data_plane_admits_only_open_leases_of_this_donor() -> None:
    """A token of another lease, of an ended lease, or of another donor is refused."""
    book = LeaseBook("donor-g", "unused", SECRET, 60.0)
    running, thread = start_donor(
        DonorConfig(name="donor-g", secret=SECRET, allow=ALLOW, lease_gate=book.is_open)
    )
    try:
        lease, _ = book.open(request("g1"))
        # Signed with the donor's secret, but no lease the API opened.
        stray = tokens.issue(SECRET, lease.info.lease + 1, "donor-g", 60.0)
        with pytest.raises(AuthError, match="not open"):
            RemoteGPU(running.endpoint, stray, transport="tcp")
        other_donor = tokens.issue(SECRET, lease.info.lease, "donor-h", 60.0)
        with pytest.raises(AuthError):
            RemoteGPU(running.endpoint, other_donor, transport="tcp")
        gpu = RemoteGPU(running.endpoint, lease.token, transport="tcp", timeout=5)
        try:
            assert gpu.invoke("echo", np.arange(3))[0].tolist() == [0, 1, 2]
            # Closed by the API: the connection ends, and the token opens nothing again.
            closed = book.close(lease.info.lease)
            assert closed is not None
            running.loop.call_soon_threadsafe(
                running.donor.revoke, lease.info.lease, closed.token.expiry
            )
            # The revoke cancels the lease's task; its worker stops a moment later, and
            # calls go on succeeding until then: a number of calls is no bound under load.
            deadline = time.monotonic() + 30
            with pytest.raises(RemoteGPUError):
                while time.monotonic() < deadline:
                    gpu.invoke("echo", np.arange(3))
        finally:
            gpu.close()
        with pytest.raises(AuthError):
            RemoteGPU(running.endpoint, lease.token, transport="tcp")
    finally:
        stop_donor(running, thread)
