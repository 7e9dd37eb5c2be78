"""Every network server of the suite holds the same limits (composable_dra.serving): the
donor's lease API and data plane, the fabric emulator (Redfish and Fsas on one server),
the metrics endpoint and a scale-out pipeline's block server. Each is started through its
own entry point with small limits, and a peer that sends half a request, or holds too
many connections, is cut off while another peer is served."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from composable_dra.process import metrics
from composable_dra.serving.limits import (
    ServerLimits,
)
from fabric_emulator import server as emulator_server
from fabric_emulator import topology
from remote_gpu import block_server
from testbed.wait import wait_for
from tests.unit.servers import Loop, cut_off

pytestmark = pytest.mark.usefixtures("fresh_budget")
SMALL = ServerLimits(per_peer=2, header_timeout=0.5, body_timeout=0.5, max_body=1024)
OTHER_PEER = "127.0.0.2"


# ---- every server, through its own entry point


@dataclass
class Server:
    address: tuple[str, int]
    request: bytes  # a complete request the server answers
    greets: bool = False  # it speaks first (the data plane's CHALLENGE)


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()


def _lease_api(loop: Loop, tmp: Path) -> tuple[Server, Callable[[], None]]:
    from remote_gpu.lease_api import LeaseAPI, LeaseAPIConfig, LeaseBook, serve

    class Nobody:
        def review(self, token: str, audiences: tuple[str, ...]) -> Any:
            raise AssertionError("no request here reaches a review")

        def claim(self, namespace: str, name: str) -> None:
            return None

    book = LeaseBook("d", "127.0.0.1:1", b"0123456789abcdef0123", 60.0)
    api = LeaseAPI(LeaseAPIConfig("d", "drv", "ctl", "plg"), book, Nobody(), Nobody())
    server, port = loop.run(serve(api, "127.0.0.1", 0, None, SMALL))
    return Server(("127.0.0.1", port), _get("/v1/leases")), lambda: loop.run(server.cleanup())


def _emulator(loop: Loop, tmp: Path) -> tuple[Server, Callable[[], None]]:
    emu = emulator_server.Emulator(topology.default(), emulator_server.Config())
    server, _url = loop.run(emulator_server.start(emu, "127.0.0.1", 0))
    address = ("127.0.0.1", server.port)
    return Server(address, _get("/admin/healthz")), lambda: loop.run(server.cleanup())


def _metrics(loop: Loop, tmp: Path) -> tuple[Server, Callable[[], None]]:
    with socket.socket() as probe:  # the endpoint takes a port number, not 0
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = metrics.serve(port, "127.0.0.1")
    assert server is not None
    return Server(("127.0.0.1", port), _get("/metrics")), lambda: asyncio.run_coroutine_threadsafe(
        server.cleanup(), server.loop
    ).result(30)


def _data_plane(loop: Loop, tmp: Path) -> tuple[Server, Callable[[], None]]:
    from remote_gpu.donor import Donor, DonorConfig

    config = DonorConfig(
        name="d",
        secret=b"0123456789abcdef0123",
        allow={},
        handshake_timeout=SMALL.header_timeout,
        max_connections_per_peer=SMALL.per_peer,
    )
    donor = Donor(config)
    host, port = loop.run(donor.start())
    return Server((host, port), b"", greets=True), lambda: loop.run(donor.close())


def _block_server(loop: Loop, tmp: Path) -> tuple[Server, Callable[[], None]]:
    from remote_gpu.block_server import BlockServer

    server = BlockServer(bound=1).serve("127.0.0.1", 0)
    return Server(
        ("127.0.0.1", server.port), _get("/metrics")
    ), lambda: asyncio.run_coroutine_threadsafe(server.cleanup(), server.loop).result(30)


SERVERS = {
    "lease_api": _lease_api,
    "emulator": _emulator,
    "metrics": _metrics,
    "data_plane": _data_plane,
    "block_server": _block_server,
}


@pytest.fixture(params=SERVERS)
def server(
    request: pytest.FixtureRequest, loop: Loop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Server]:
    # The entry points' own limits, made small (absent on a server that has none).
    monkeypatch.setattr(emulator_server, "LIMITS", SMALL, raising=False)
    monkeypatch.setattr(metrics, "LIMITS", SMALL, raising=False)
    monkeypatch.setattr(block_server, "LIMITS", SMALL, raising=False)
    served, stop = SERVERS[request.param](loop, tmp_path)
    yield served
    stop()


def _connect(server: Server, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(server.address, timeout=10, source_address=(source, 0))


def _answers(server: Server, source: str = "127.0.0.1") -> bool:
    with _connect(server, source) as sock:
        sock.sendall(server.request)
        return bool(sock.recv(64))


def test_a_half_sent_request_is_cut_off_at_the_header_deadline(server: Server) -> None:
    with _connect(server) as sock:
        sock.sendall(server.request[:20] if server.request else b"RGPU")
        start = time.monotonic()
        assert cut_off(sock, SMALL.header_timeout + 5)
        assert time.monotonic() - start >= SMALL.header_timeout - 0.1
    assert _answers(server)


def test_an_idle_connection_is_cut_off_too(server: Server) -> None:
    with _connect(server) as sock:
        assert cut_off(sock, SMALL.header_timeout + 5)


def test_a_peer_holds_a_bounded_number_of_connections(server: Server) -> None:
    held = [_connect(server) for _ in range(SMALL.per_peer)]
    try:
        if server.greets:  # accepted and served: each got its greeting
            assert all(s.recv(1) for s in held)
        with _connect(server) as extra:
            assert cut_off(extra, SMALL.header_timeout / 2)  # refused at once
        assert _answers(server, OTHER_PEER)  # another address is served meanwhile
    finally:
        for sock in held:
            sock.close()
    assert wait_for(lambda: _answers(server), 10, "a place for the first peer again")
