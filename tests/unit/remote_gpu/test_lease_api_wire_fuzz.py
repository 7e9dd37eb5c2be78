"""The lease API's request parsing on the wire, fuzzed: whatever bytes a peer sends (a
request line, headers, an ``Authorization`` header, a body), the server behind its limits
answers a typed refusal below 500 or closes the connection, stays up, and its logs never
carry the token (the pure parsers' own fuzz tests are in test_lease_api.py)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from composable_dra.lending.remote_leases import Code, LeaseAPIError
from composable_dra.serving.limits import ServerLimits
from remote_gpu.identity import Identity
from remote_gpu.lease_api import LeaseAPI, LeaseAPIConfig, LeaseBook, serve

from ..servers import Loop
from .conftest import SECRET

LIMITS = ServerLimits(per_peer=64, header_timeout=0.5, body_timeout=0.3, max_body=16384)
MARK = b"s3cr3t-marker"  # in every token sent: it must reach no log line


class Refuser:
    """A TokenReview that authenticates nothing; the claim read finds nothing."""

    def review(self, token: str, audiences: tuple[str, ...]) -> Identity:
        raise LeaseAPIError(Code.UNAUTHENTICATED, "the token does not authenticate")

    def claim(self, namespace: str, name: str) -> None:
        return None


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.text.append(self.format(record))


@pytest.fixture(scope="module")
def wire() -> Iterator[tuple[int, Lines]]:
    loop = Loop()
    api = LeaseAPI(
        LeaseAPIConfig("d", "drv", "ctl", "plg"),
        LeaseBook("d", "127.0.0.1:1", SECRET, 60.0),
        Refuser(),
        Refuser(),
    )
    server, port = loop.run(serve(api, "127.0.0.1", 0, None, LIMITS))
    lines = Lines()
    logging.getLogger().addHandler(lines)
    yield port, lines
    logging.getLogger().removeHandler(lines)
    loop.run(server.cleanup())
    loop.close()


METHODS = st.sampled_from([b"GET", b"POST", b"DELETE", b"PUT", b"G\x00T"]) | st.binary(
    min_size=1, max_size=8
)
PATHS = (
    st.sampled_from(
        [b"/v1/leases", b"/v1/leases/status", b"/v1/leases/1/credentials", b"/v1/leases/1"]
    )
    | st.from_regex(rb"/[ -~]{0,40}", fullmatch=True)
    | st.binary(max_size=40)
)
NAMES = st.sampled_from(
    [b"Content-Type", b"Content-Length", b"Transfer-Encoding", b"Host", b"Authorization"]
) | st.binary(min_size=1, max_size=16)
PRINTABLE = st.from_regex(rb"[ -~]{0,40}", fullmatch=True)
HEADERS = st.lists(st.tuples(NAMES, PRINTABLE | st.binary(max_size=40)), max_size=4)
SCHEMES = st.sampled_from([b"Bearer ", b"bearer ", b"Basic ", b"", b"Bearer\t"])
# Any bytes: ASCII, a control byte the parser refuses, or bytes that are not UTF-8 (which
# reach the authentication and must be a 401 there, not a 500).
TOKEN_TEXT = st.binary(max_size=24)
TOKENS = st.tuples(SCHEMES, TOKEN_TEXT, TOKEN_TEXT).map(lambda t: t[0] + t[1] + MARK + t[2])


def _exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@settings(max_examples=200)
@given(METHODS, PATHS, HEADERS, TOKENS, st.binary(max_size=300))
def test_any_request_gets_a_refusal_or_a_close_and_no_token_is_logged(
    wire: tuple[int, Lines],
    method: bytes,
    path: bytes,
    headers: list[tuple[bytes, bytes]],
    token: bytes,
    body: bytes,
) -> None:
    port, lines = wire
    head = [method + b" " + path + b" HTTP/1.1", b"Host: donor", b"Authorization: " + token]
    head += [name + b": " + value for name, value in headers]
    head += [b"Content-Length: %d" % len(body), b"Connection: close"]
    answer = _exchange(port, b"\r\n".join(head) + b"\r\n\r\n" + body)
    if answer:  # else cut off: a request the parser waits on, until its deadline
        assert answer.startswith(b"HTTP/1."), answer[:80]
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500, answer[:200]
        event(f"answered {status}")
    else:
        event("cut off")
    assert not any(MARK.decode() in line for line in lines.text)


def test_the_server_still_answers_after_the_fuzz(wire: tuple[int, Lines]) -> None:
    port, _ = wire
    answer = _exchange(port, b"GET /v1/leases HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401 ")
