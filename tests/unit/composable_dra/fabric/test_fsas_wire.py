"""The fsas-fm backend on the wire (issue 25, items 4 and 8), against real local HTTP
servers whose answers each test writes: redirects, trickled and oversized answers,
garbage bodies, and a CA bundle in the environment."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import certifi
import pytest

from composable_dra.fabric import errors as fe
from composable_dra.fabric.connection import Connection
from composable_dra.fabric.fsas import FsasCredentials, FsasFabricManagerBackend
from composable_dra.fabric.http_answer import MAX_ANSWER
from testbed.pki import CertificateAuthority

CREDS = FsasCredentials("cdra", "s3cr3t-client", "admin", "pa55word-x")
TOKEN_PATH = "/id_manager/realms/lab/protocol/openid-connect/token"
MACHINES_PATH = "/fabric_manager/api/v1/machines"
TOKEN = json.dumps({"access_token": "tok-1", "expires_in": 300}).encode()
NO_MACHINES = json.dumps({"data": {"machines": []}}).encode()

Answer = Callable[["Handler"], None]


class Handler(BaseHTTPRequestHandler):
    server: Wire

    def _any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        self.server.seen.append((self.command, path, body))
        self.server.ports.append(self.client_address[1])
        self.server.answers.get(path, not_found)(self)

    do_GET = do_POST = do_PATCH = do_DELETE = _any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send(self, status: int, body: bytes, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)


def not_found(h: Handler) -> None:
    h.send(404, b'{"status": 404, "detail": {"code": "E_NOT_FOUND", "message": "no"}}')


def answer(status: int, body: bytes, **headers: str) -> Answer:
    return lambda h: h.send(status, body, **headers)


class Wire(ThreadingHTTPServer):
    """A local server: ``answers`` by path, ``seen`` every request (method, path, body)."""

    daemon_threads = True

    def __init__(self, tls: ssl.SSLContext | None = None, handler: type[Handler] = Handler) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.answers: dict[str, Answer] = {TOKEN_PATH: answer(200, TOKEN)}
        self.seen: list[tuple[str, str, bytes]] = []
        self.ports: list[int] = []  # the client's port of each request
        self.stop = threading.Event()  # ends a trickling answer
        self.scheme = "https" if tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> Wire:
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()


@pytest.fixture
def wire() -> Iterator[Wire]:
    with Wire() as w:
        yield w


def fm(url: str, **kw: Any) -> FsasFabricManagerBackend:
    return FsasFabricManagerBackend(url, CREDS, tenant_uuid="t-1", realm="lab", **kw)


def secret_free(text: str) -> None:
    assert CREDS.client_secret not in text and CREDS.password not in text


# -- item 4: no credentials across a redirect ------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirected_token_request_is_refused_and_the_secret_goes_nowhere(
    wire: Wire, status: int
) -> None:
    """Followed, a 307/308 re-sent the form (client secret, password) to another host,
    https or not."""
    with Wire() as elsewhere:
        wire.answers[TOKEN_PATH] = answer(status, b"", Location=f"{elsewhere.url}/steal")
        with pytest.raises(fe.AuthError, match="redirect") as refused:
            fm(wire.url).hosts()
        assert elsewhere.seen == []
    secret_free(str(refused.value))
    assert [(m, p) for m, p, _ in wire.seen] == [("POST", TOKEN_PATH)]


def test_a_redirected_call_is_a_fabric_error_and_is_not_followed(wire: Wire) -> None:
    with Wire() as elsewhere:
        elsewhere.answers[MACHINES_PATH] = answer(200, NO_MACHINES)
        wire.answers[MACHINES_PATH] = answer(307, b"", Location=f"{elsewhere.url}{MACHINES_PATH}")
        with pytest.raises(fe.BadAnswerError, match="redirect"):
            fm(wire.url).hosts()
        assert elsewhere.seen == []


# -- item 8: one deadline per call, a size cap -------------------------------------------------


def trickle(body: bytes, every: float, headers_too: bool = False) -> Answer:
    """The answer's body (and with ``headers_too`` its status line and headers as well),
    a byte at a time: each read returns within any read timeout."""

    def send(h: Handler) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        if not headers_too:
            h.wfile.write(head)
        slow = head + body if headers_too else body
        for i in range(len(slow)):
            if h.server.stop.wait(every):
                return
            try:
                h.wfile.write(slow[i : i + 1])
                h.wfile.flush()
            except OSError:
                return  # the client gave up

    return send


@pytest.mark.parametrize("headers_too", [False, True], ids=["body", "whole answer"])
def test_a_trickled_answer_ends_at_the_calls_deadline(wire: Wire, headers_too: bool) -> None:
    """requests' timeout bounds each read: trickled, a 1 s call took as long as the FM
    liked (here 6 s or more)."""
    wire.answers[MACHINES_PATH] = trickle(NO_MACHINES.ljust(60), 0.1, headers_too)
    backend = fm(wire.url, connection=Connection(timeout=1.0))
    started = time.monotonic()
    with pytest.raises(fe.TransientError, match="time limit"):
        backend.hosts()
    assert time.monotonic() - started < 2.5


def test_a_silent_answer_ends_at_the_calls_deadline(wire: Wire) -> None:
    """Headers, then nothing: the read waits only for what is left of the call."""

    def silent(h: Handler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "100")
        h.end_headers()
        h.wfile.write(b'{"data":')
        h.wfile.flush()
        h.server.stop.wait(30)

    wire.answers[MACHINES_PATH] = silent
    backend = fm(wire.url, connection=Connection(timeout=1.0))
    started = time.monotonic()
    with pytest.raises(fe.TransientError):
        backend.hosts()
    assert time.monotonic() - started < 2.5


def test_an_answer_over_the_cap_is_a_bad_answer(wire: Wire) -> None:
    huge = b'{"data": {"machines": [' + b" " * MAX_ANSWER + b"]}}"
    wire.answers[MACHINES_PATH] = answer(200, huge)
    with pytest.raises(fe.BadAnswerError, match="more than"):
        fm(wire.url).hosts()


def test_every_request_asks_for_an_uncompressed_answer(wire: Wire) -> None:
    """A few compressed bytes could be gigabytes once inflated, past any byte cap."""
    encodings: list[str | None] = []

    def record(h: Handler) -> None:
        encodings.append(h.headers.get("Accept-Encoding"))
        h.send(200, NO_MACHINES)

    wire.answers[MACHINES_PATH] = record
    fm(wire.url).hosts()
    assert encodings == ["identity"]


class KeepAlive(Handler):
    protocol_version = "HTTP/1.1"


def test_a_connection_read_to_its_end_is_used_again() -> None:
    """Answers are read by hand (streamed): a whole one still frees its connection for
    the next call, instead of a new connection (and TLS handshake) per call."""
    with Wire(handler=KeepAlive) as w:
        w.answers[MACHINES_PATH] = answer(200, NO_MACHINES)
        backend = fm(w.url)
        backend.hosts()
        backend.hosts()
        backend.close()
    assert len(w.ports) == 3 and len(set(w.ports)) == 1  # the token, then two calls


# -- item 8: garbage answers are typed errors --------------------------------------------------

GARBAGE_TOKENS = {
    "NaN lifetime": b'{"access_token": "t", "expires_in": NaN}',
    "Infinity lifetime": b'{"access_token": "t", "expires_in": Infinity}',
    "overflowing lifetime": b'{"access_token": "t", "expires_in": 1e999}',
    "huge integer lifetime": b'{"access_token": "t", "expires_in": ' + b"9" * 400 + b"}",
    "a list": b'[{"access_token": "t", "expires_in": 300}]',
    "deep": b"[" * 50_000 + b"]" * 50_000,
    "token not a string": b'{"access_token": {"t": 1}, "expires_in": 300}',
    "token with a newline": b'{"access_token": "t\\r\\nX-Evil: 1", "expires_in": 300}',
    "not UTF-8": b'{"access_token": "\xff", "expires_in": 300}',
}


@pytest.mark.parametrize("body", GARBAGE_TOKENS.values(), ids=GARBAGE_TOKENS.keys())
def test_a_garbage_token_answer_is_a_fabric_error(wire: Wire, body: bytes) -> None:
    wire.answers[TOKEN_PATH] = answer(200, body)
    with pytest.raises(fe.FabricError) as caught:
        fm(wire.url).hosts()
    assert isinstance(caught.value, fe.AuthError | fe.BadAnswerError)


GARBAGE_MACHINES = {
    "a list for data": b'{"data": []}',
    "an object for machines": b'{"data": {"machines": {"m": 1}}}',
    "a list for the answer": b"[]",
    "deep": b'{"data": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    "NaN": b'{"data": {"machines": [NaN]}}',
    "not JSON": b"<html>proxy error</html>",
}


@pytest.mark.parametrize("body", GARBAGE_MACHINES.values(), ids=GARBAGE_MACHINES.keys())
def test_a_garbage_answer_is_a_bad_answer(wire: Wire, body: bytes) -> None:
    wire.answers[MACHINES_PATH] = answer(200, body)
    with pytest.raises(fe.BadAnswerError):
        fm(wire.url).hosts()


def test_a_failure_whose_body_is_not_json_keeps_its_status(wire: Wire) -> None:
    wire.answers[MACHINES_PATH] = answer(502, b"<html>bad gateway</html>")
    with pytest.raises(fe.TransientError, match="HTTP 502"):
        fm(wire.url).hosts()


def test_an_absurd_retry_after_is_a_bad_answer_not_decades_of_waiting(wire: Wire) -> None:
    body = b'{"status": 503, "detail": {"code": "E_BUSY", "message": "later"}}'
    wire.answers[MACHINES_PATH] = answer(503, body, Retry_After="999999999")
    with pytest.raises(fe.BadAnswerError, match="more than a day"):
        fm(wire.url).hosts()
    wire.answers[MACHINES_PATH] = answer(503, body, Retry_After="4")
    with pytest.raises(fe.BusyError) as busy:
        fm(wire.url).hosts()
    assert busy.value.retry_after == 4.0


# -- item 8: the Fabric's CA, whatever the environment says ------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ssl.SSLContext]:
    ca = CertificateAuthority(tmp_path_factory.mktemp("fsas-pki"))
    pair = ca.issue("fm", "fm", ips=("127.0.0.1",), server=True)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pair.cert, pair.key)
    return ca.cert_path, tls


def test_the_fabrics_ca_wins_over_requests_ca_bundle(
    pki: tuple[Path, ssl.SSLContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests let REQUESTS_CA_BUNDLE replace a session's own CA: a Fabric with its CA
    failed TLS wherever the environment named another bundle."""
    ca, tls = pki
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    monkeypatch.setenv("CURL_CA_BUNDLE", certifi.where())
    with Wire(tls) as fabric:
        fabric.answers[MACHINES_PATH] = answer(200, NO_MACHINES)
        assert fm(fabric.url, connection=Connection(ca_file=str(ca))).hosts() == {}
        with pytest.raises(fe.TransientError):  # and without it, the FM is not trusted
            fm(fabric.url).hosts()
