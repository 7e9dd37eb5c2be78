"""The lease API's authentication under bad input and a bad API server: a bearer that is
not UTF-8, an API server that does not answer, and a flood of made-up bearers while the
TokenReviews are slow. The handlers run on a real aiohttp server over TLS; the
TokenReview is this module's stand-in, or the real client against a closed port."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st
from kubernetes import client as k8s

from composable_dra.k8s.kube import Kube
from composable_dra.lending.remote_leases import Code, LeaseAPIError, retry_after
from remote_gpu.lease_api import KubeReviewer, bearer
from remote_gpu.token_reviews import UNKNOWN_LANE
from testbed.controlplane import free_port
from testbed.wait import wait_for

from .test_lease_api import DONOR, FUZZ, Served, allocated_claim, request


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path)
    yield s
    s.reviewer.release.set()
    s.close()


def raw_request(served: Served, authorization: bytes) -> tuple[int, bytes]:
    """GET /v1/leases with this Authorization header, bytes as they are: the status line's
    code and the response's head."""
    ctx = ssl.create_default_context(cafile=served.ca)
    host, port = served.url.removeprefix("https://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        tls.sendall(
            b"GET /v1/leases HTTP/1.1\r\nHost: donor\r\nConnection: close\r\n"
            b"Authorization: " + authorization + b"\r\n\r\n"
        )
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    head = data.partition(b"\r\n\r\n")[0]
    return int(head.split(b" ", 2)[1]), head


def test_a_bearer_that_is_not_utf8_is_unauthenticated(served: Served) -> None:
    for value in (b"Bearer \xff\xfe\xfd", b"Bearer ab\xc3(cd", b"Bearer \xe2\x82\xac"):
        status, head = raw_request(served, value)
        assert status == 401, head
    assert served.reviewer.calls == []  # no TokenReview for what is no token


def test_an_api_server_that_does_not_answer_is_503_with_retry_after(tmp_path: Path) -> None:
    """The real TokenReview client, against a port nothing listens on."""
    cfg = k8s.Configuration(host=f"https://127.0.0.1:{free_port()}")
    cfg.retries = False  # refused at once, not after urllib3's three tries
    reviewer = KubeReviewer(Kube(k8s.ApiClient(cfg)))
    s = Served(tmp_path, reviewer)
    try:
        http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=s.ca, retries=False)
        resp = http.request(
            "GET", s.url + "/v1/leases", headers={"Authorization": "Bearer some.jwt.here"}
        )
        assert resp.status == 503, resp.data
        assert resp.json()["code"] == "unavailable"
        assert int(resp.headers["Retry-After"]) >= 1
        # The client carries the wait to the retry policy.
        with pytest.raises(LeaseAPIError) as err:
            s.client("some.jwt.here").list(DONOR)
        assert err.value.code is Code.UNAVAILABLE and err.value.retry_after is not None
    finally:
        s.close()


class Flood:
    """``n`` callers with made-up bearers whose TokenReviews hang until ``end``; started
    once the unknown lane is full of them."""

    def __init__(self, served: Served, n: int) -> None:
        self.served = served
        self.errors: list[LeaseAPIError] = []
        served.reviewer.release.clear()
        self.threads = [threading.Thread(target=self._call, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()
        wait_for(
            lambda: served.reviewer.hanging >= UNKNOWN_LANE,
            10,
            "the unknown lane to fill with hanging reviews",
        )

    def _call(self, i: int) -> None:
        try:
            self.served.client(f"slow-{i}").list(DONOR)
        except LeaseAPIError as exc:
            self.errors.append(exc)

    def end(self) -> None:
        self.served.reviewer.release.set()
        for t in self.threads:
            t.join(30)


def test_a_flood_of_unknown_bearers_does_not_starve_an_authorized_call(served: Served) -> None:
    """TokenReviews of made-up bearers hang (a slow API server); meanwhile the consumer
    node's plugin, whose token the donor knows, collects its lease's credentials (a claim
    read, after its review) promptly, and the flood beyond the unknown lane is turned away
    at once with a Retry-After."""
    info = served.client("controller").open(DONOR, request("f1"))
    served.claims.items[("ns", "c1")] = allocated_claim("f1")
    plugin = served.client("plugin-c")
    plugin.credentials(DONOR, info.lease)  # its token is known from here on

    flood = Flood(served, 40)
    started = time.monotonic()
    token = plugin.credentials(DONOR, info.lease)
    assert token["lease"] == info.lease
    assert time.monotonic() - started < 2.0
    flood.end()
    assert len(flood.errors) == 40
    turned_away = [e for e in flood.errors if e.code is Code.UNAVAILABLE]
    assert turned_away and all(e.retry_after is not None for e in turned_away)
    assert {e.code for e in flood.errors} <= {Code.UNAVAILABLE, Code.UNAUTHENTICATED}
    # The API server was never asked more of the flood at once than the lane holds.
    assert served.reviewer.most_hanging == UNKNOWN_LANE


def test_a_known_caller_is_reviewed_again_beside_a_flood(tmp_path: Path) -> None:
    """Answers are not reused here (ttl 0): the known token's fresh review runs on the
    known lane while the unknown one hangs."""
    s = Served(tmp_path, review_ttl=0.0)
    try:
        controller = s.client("controller")
        controller.list(DONOR)
        flood = Flood(s, UNKNOWN_LANE * 3)
        before = s.reviewer.calls.count("controller")
        started = time.monotonic()
        controller.list(DONOR)
        assert time.monotonic() - started < 2.0
        assert s.reviewer.calls.count("controller") == before + 1  # reviewed again
        flood.end()
    finally:
        s.reviewer.release.set()
        s.close()


@FUZZ
@given(st.binary(max_size=64).map(lambda b: b.decode("utf-8", "surrogateescape")))
def test_bearer_of_any_header_bytes_is_a_token_or_unauthenticated(raw: str) -> None:
    """aiohttp hands header bytes that are not UTF-8 over as surrogates: none reaches a
    TokenReview, and whatever does is ASCII."""
    try:
        token = bearer("Bearer " + raw)
    except LeaseAPIError as exc:
        assert exc.code is Code.UNAUTHENTICATED
        return
    assert token.isascii() and token.encode("ascii")


@FUZZ
@given(st.none() | st.text(max_size=12))
def test_retry_after_fuzz(value: str | None) -> None:
    after = retry_after(value)
    assert after is None or 0 <= after <= 3600
