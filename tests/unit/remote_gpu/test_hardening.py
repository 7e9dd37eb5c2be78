"""Hostile peers on both sides of a lease: a donor that survives accept
failures, half-open and too many connections, and hostile HELLOs; a client that trusts no
arena it cannot prove is its lease's, never sends its token's secret, and never waits
forever; requests that cannot be replayed."""

from __future__ import annotations

import errno
import itertools
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from prometheus_client import REGISTRY

from composable_dra.serving.accept import accept_backoff
from remote_gpu import tokens
from remote_gpu.arena import SEAL_SIZE, SHM_DIR
from remote_gpu.client import RemoteGPU
from remote_gpu.donor import DonorConfig
from remote_gpu.errors import (
    AuthError,
    DeadlineExceeded,
    FrameError,
    RemoteGPUError,
    SequenceError,
)
from remote_gpu.protocol import HEADER_SIZE, HELLO_KEY, MAX_META, Header, Op, unpack
from testbed.wait import wait_for

from .conftest import ALLOW, SECRET, Running, start_donor, stop_donor
from .rogue import Rogue, accept_frame, recv_exact
from .test_fast_path import _invoke_chunks, _refusal

T = TypeVar("T")


def _bounded(fn: Callable[[], T], seconds: float) -> T:
    """``fn()`` in a thread: a test fails, rather than hangs, if it blocks for good."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]  # type: ignore[no-any-return]


def _frame(sock: socket.socket) -> tuple[Header, bytes] | None:
    """One frame under the public key: header and metadata; None once the peer closed."""
    try:
        raw = recv_exact(sock, HEADER_SIZE)
        header = unpack(raw, HELLO_KEY, MAX_META)
        return header, recv_exact(sock, header.length)
    except (ConnectionError, OSError):
        return None


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def _errors(code: str) -> float:
    labels = {"side": "donor", "code": code}
    return REGISTRY.get_sample_value("remote_gpu_errors_total", labels) or 0.0


@pytest.fixture
def own_donor(request: pytest.FixtureRequest) -> Iterator[Running]:
    """A donor of this test's own; indirect parameters are ``DonorConfig`` fields."""
    fields: dict[str, Any] = getattr(request, "param", {})
    running, thread = start_donor(DonorConfig(name="own", secret=SECRET, allow=ALLOW, **fields))
    yield running
    stop_donor(running, thread)


def _echo(running: Running, **kwargs: Any) -> list[int]:
    with RemoteGPU(running.endpoint, running.token(), timeout=10, **kwargs) as gpu:
        return list(gpu.invoke("echo", np.arange(3))[0].tolist())


# ---- 1. accept errors, half-open connections, connections per peer


def test_accept_backoff_grows_to_a_bound() -> None:
    pauses = [accept_backoff(n) for n in range(1, 13)]
    assert 0 < pauses[0] <= 0.01 <= pauses[1]
    assert all(0.5 <= p <= 1.0 for p in pauses[8:])  # jittered, within half the bound


def test_accept_errors_are_survived(own_donor: Running) -> None:
    """EMFILE from accept() once ended the accept task for good, silently."""
    loop = own_donor.loop
    real = loop.sock_accept
    failures = [3]

    async def flaky(sock: socket.socket) -> tuple[socket.socket, Any]:
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return await real(sock)

    before = _errors("accept_failed")
    loop.sock_accept = flaky  # type: ignore[method-assign]
    # The accept already waiting takes this one; the three after it fail.
    assert _bounded(lambda: _echo(own_donor, transport="tcp"), 30) == [0, 1, 2]
    assert _bounded(lambda: _echo(own_donor, transport="tcp"), 30) == [0, 1, 2]
    assert failures == [0] and _errors("accept_failed") - before == 3


@pytest.mark.parametrize("own_donor", [{"handshake_timeout": 0.5}], indirect=True)
def test_a_half_open_connection_is_dropped_after_the_handshake_timeout(
    own_donor: Running,
) -> None:
    with socket.create_connection((own_donor.host, own_donor.port), timeout=10) as s:
        challenge = _frame(s)
        assert challenge is not None and challenge[0].op == Op.CHALLENGE
        s.sendall(b"RGPU")  # a HELLO's first bytes, and then nothing
        start = time.monotonic()
        answer = _frame(s)
        assert answer is not None and answer[0].op == Op.ERROR
        assert json.loads(answer[1])["code"] == "deadline_exceeded"
        assert _closed(s)
        assert time.monotonic() - start < 5
    assert _echo(own_donor) == [0, 1, 2]


@pytest.mark.parametrize(
    "own_donor", [{"max_connections_per_peer": 3, "handshake_timeout": 60}], indirect=True
)
def test_connections_per_peer_address_are_bounded(own_donor: Running) -> None:
    address = (own_donor.host, own_donor.port)
    held = [socket.create_connection(address, timeout=10) for _ in range(3)]
    try:
        for s in held:
            frame = _frame(s)
            assert frame is not None and frame[0].op == Op.CHALLENGE
        with socket.create_connection(address, timeout=10) as extra:
            answer = _frame(extra)
            assert answer is not None and answer[0].op == Op.ERROR
            assert json.loads(answer[1])["code"] == "rate_limited"
            assert _closed(extra)
        with pytest.raises(RemoteGPUError, match="too many connections"):
            RemoteGPU(own_donor.endpoint, own_donor.token(), timeout=10)
        held.pop().close()
        assert wait_for(lambda: _echo(own_donor), 10, "a free place for a good client")
    finally:
        for s in held:
            s.close()


# ---- 2. the client maps only arenas it can prove are its lease's


def _victim(tmp: Path) -> Path:
    path = tmp / "victim"
    path.write_bytes(b"precious" * 2048)
    return path


SLOT = 1 << 16
ARENA_SIZE = SLOT + SEAL_SIZE  # one slot, no ring, the seal


def _shm(name: str) -> Path:
    return SHM_DIR / name


@pytest.mark.parametrize(
    "case", ["traversal", "absolute", "other-lease", "symlink", "hardlink", "unsealed", "unproven"]
)
def test_a_rogue_donor_cannot_make_the_client_write_a_file(tmp_path: Path, case: str) -> None:
    tok = tokens.issue(SECRET, 0x5EED + len(case), "rogue", 60)
    victim = _victim(tmp_path)
    good_name = f"remote-gpu-{tok.lease:016x}-{secrets.token_hex(8)}"
    made: list[Path] = []
    name = good_name
    key_known = True
    if case == "traversal":
        name = f"../../../{tmp_path.name}/victim"
    elif case == "absolute":
        name = str(victim)
    elif case == "other-lease":
        name = f"remote-gpu-{tok.lease + 1:016x}-{secrets.token_hex(8)}"
    elif case == "symlink":
        _shm(name).symlink_to(victim)
        made.append(_shm(name))
    elif case == "hardlink":
        victim = _shm(f"rgpu-test-victim-{secrets.token_hex(4)}")
        victim.write_bytes(bytes(ARENA_SIZE))
        made.append(victim)
        os.link(victim, _shm(name))
        made.append(_shm(name))
    elif case == "unsealed":
        victim = _shm(name)
        victim.write_bytes(bytes(ARENA_SIZE))
        made.append(victim)
    elif case == "unproven":
        key_known = False
        victim = _shm(name)
        victim.write_bytes(bytes(ARENA_SIZE))
        made.append(victim)
    before = victim.read_bytes()

    def script(sock: socket.socket, session: dict[str, Any]) -> None:
        key = session["key"] if key_known else secrets.token_bytes(32)
        sock.sendall(
            accept_frame(
                session, tok.lease, key, transport="shm", arena=name, arena_size=ARENA_SIZE
            )
        )
        sock.recv(1)  # until the client hangs up

    rogue = Rogue(script, tok if key_known else None)
    try:
        with pytest.raises((AuthError, FrameError)):  # a lie, or a name that is no name
            _bounded(lambda: RemoteGPU(rogue.endpoint, tok, transport="shm", timeout=5), 30)
        assert victim.read_bytes() == before
    finally:
        rogue.close()
        for path in made:
            path.unlink(missing_ok=True)


def test_a_sealed_arena_is_accepted(tmp_path: Path) -> None:
    """The positive control of the checks above: the donor's own arena passes them."""
    from remote_gpu.arena import Arena

    tok = tokens.issue(SECRET, 0xA11CE, "rogue", 60)
    arenas: list[Arena] = []

    def script(sock: socket.socket, session: dict[str, Any]) -> None:
        arena = Arena.create(SLOT, 1, 0, lease=tok.lease)
        arenas.append(arena)
        arena.seal(session["key"], tok.lease)
        sock.sendall(
            accept_frame(
                session,
                tok.lease,
                session["key"],
                transport="shm",
                arena=arena.path.name,
                arena_size=arena.size,
            )
        )
        sock.recv(1)

    rogue = Rogue(script, tok)
    try:
        gpu = _bounded(lambda: RemoteGPU(rogue.endpoint, tok, transport="shm", timeout=5), 30)
        assert gpu.arena is not None and gpu.arena.path == arenas[0].path
        gpu.close()
    finally:
        rogue.close()
        for arena in arenas:
            arena.close()


# ---- 3. proof of possession; a closed lease's token is dead


def test_the_token_secret_never_goes_on_the_wire() -> None:
    tok = tokens.issue(SECRET, 0xB0B, "rogue", 60)
    rogue = Rogue(lambda sock, session: None)  # hangs up after the HELLO
    try:
        with pytest.raises((RemoteGPUError, OSError)):
            _bounded(lambda: RemoteGPU(rogue.endpoint, tok, timeout=5), 30)
        assert rogue.done.wait(10) and rogue.hello_bytes
        assert tok.mac_bytes not in rogue.hello_bytes
        assert tok.mac.encode() not in rogue.hello_bytes.lower()
    finally:
        rogue.close()


def test_a_recorded_hello_is_refused(donor: Running) -> None:
    """A HELLO proves possession for one challenge only: replayed, it proves nothing."""
    tok = donor.token()
    rogue = Rogue(lambda sock, session: None)
    try:
        with pytest.raises((RemoteGPUError, OSError)):
            _bounded(lambda: RemoteGPU(rogue.endpoint, tok, timeout=5), 30)
        assert rogue.done.wait(10) and rogue.hello_bytes
    finally:
        rogue.close()
    with socket.create_connection((donor.host, donor.port), timeout=10) as s:
        assert _frame(s) is not None  # the donor's own challenge
        s.sendall(rogue.hello_bytes)
        answer = _frame(s)
        assert answer is not None and answer[0].op == Op.ERROR
        assert json.loads(answer[1])["code"] == "auth_failed"
    assert tok.lease not in donor.donor.leases


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_closed_leases_token_opens_nothing(donor: Running, transport: str) -> None:
    tok = donor.token()
    with RemoteGPU(donor.endpoint, tok, transport=transport) as gpu:
        assert gpu.invoke("echo", np.arange(2))[0].tolist() == [0, 1]
    wait_for(lambda: tok.lease not in donor.donor.leases, 10, "the lease to end")
    with pytest.raises(AuthError, match="closed"):
        RemoteGPU(donor.endpoint, tok, transport=transport)


def test_closed_leases_are_forgotten_once_their_tokens_expire(own_donor: Running) -> None:
    donor = own_donor.donor
    for lease, expiry in ((1, time.time() - 1), (2, time.time() + 60)):
        donor._closed[lease] = expiry
        donor._expiries.append((expiry, lease))
    assert not donor._lease_closed(1) and donor._lease_closed(2)
    assert donor._closed.keys() == {2} and [lease for _, lease in donor._expiries] == [2]


# ---- 6. HELLOs that once raised before authentication


HOSTILE = {
    "infinity": b'{"versions": [2], "credits": Infinity}',
    "nan": b'{"versions": [NaN]}',
    "overflow": b'{"versions": [2], "target_rate": 1e999}',
    "huge-int": b'{"versions": [' + b"9" * 5000 + b"]}",
    "deep": b"[" * 30_000 + b"]" * 30_000,
    "deep-but-short": b"[" * 2000 + b"]" * 2000,
    "deep-object": b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
    "not-utf8": b'{"versions": "\xff\xfe"}',
    "not-an-object": b"[2, 3]",
}


@pytest.mark.parametrize("body", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_hello_bodies_get_a_typed_error(donor: Running, body: bytes) -> None:
    meta = body + bytes(32)  # and a proof
    if len(meta) > MAX_META:
        meta = meta[:MAX_META]  # (the donor refuses it by its length alone)
    head = Header(Op.HELLO, 1, 0, length=len(meta)).pack(HELLO_KEY)
    with socket.create_connection((donor.host, donor.port), timeout=10) as s:
        assert _frame(s) is not None
        s.sendall(head + meta)
        answer = _frame(s)
    assert answer is not None and answer[0].op == Op.ERROR
    assert json.loads(answer[1])["code"] == "bad_frame"
    assert _echo(donor) == [0, 1, 2]


# ---- 7. every wait of the client has a deadline


def test_a_silent_donor_times_the_handshake_out() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        tok = tokens.issue(SECRET, 7, "silent", 60)
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            _bounded(lambda: RemoteGPU(endpoint, tok, timeout=1), 30)
        assert time.monotonic() - start < 10
    finally:
        listener.close()


def _stalling(tok: tokens.Token, then: Callable[[socket.socket], None], **fields: Any) -> Rogue:
    """A donor that opens the lease properly (TCP), then does ``then``."""
    release = threading.Event()

    def script(sock: socket.socket, session: dict[str, Any]) -> None:
        sock.sendall(accept_frame(session, tok.lease, session["key"], **fields))
        then(sock)
        release.wait(30)

    rogue = Rogue(script, tok)
    rogue.release = release  # type: ignore[attr-defined]
    return rogue


@pytest.mark.parametrize("stall", ["silent", "mid-frame", "not-reading"])
def test_calls_on_a_stalled_donor_time_out(stall: str) -> None:
    tok = tokens.issue(SECRET, 0xC0FFEE, "rogue", 60)
    big = 64 << 20
    if stall == "mid-frame":

        def then(sock: socket.socket) -> None:
            sock.recv(65536)  # the request...
            sock.sendall(b"RGPU\x02")  # ...answered by a reply's first bytes only

        rogue = _stalling(tok, then)
    elif stall == "silent":
        rogue = _stalling(tok, lambda sock: None)
    else:
        rogue = _stalling(tok, lambda sock: None, slot_size=big)  # and never reads
    try:
        gpu = _bounded(lambda: RemoteGPU(rogue.endpoint, tok, transport="tcp", timeout=1), 30)
        arg = np.zeros(big - 4096 if stall == "not-reading" else 3, dtype=np.uint8)
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            _bounded(lambda: gpu.invoke("echo", arg), 30)
        assert time.monotonic() - start < 15
        gpu.close()
    finally:
        rogue.release.set()  # type: ignore[attr-defined]
        rogue.close()


# ---- 10. replayed or reordered requests


def _renumber(gpu: RemoteGPU, start: int) -> None:
    """Let the client's own next requests come after the ones a test sent by hand."""
    with gpu._send_lock:
        gpu._seq = itertools.count(start)


@pytest.mark.parametrize("served", ["direct", "relayed"])
@pytest.mark.parametrize("order", [(1000, 1000), (1001, 1000)], ids=["replayed", "reordered"])
def test_a_replayed_or_reordered_invoke_is_refused(
    request: pytest.FixtureRequest, served: str, order: tuple[int, int]
) -> None:
    running: Running = request.getfixturevalue("donor" if served == "direct" else "relayed")
    with RemoteGPU(running.endpoint, running.token(), transport="tcp") as gpu:
        frames = [f for seq in order for f in gpu._invoke_frames(seq, None, "echo", [np.ones(4)])]
        gpu._tr.send_frames(frames)
        _renumber(gpu, 2000)
        with pytest.raises(SequenceError, match=f"request {order[1]} after {order[0]}"):
            gpu.heartbeat()


def test_a_replayed_ring_entry_is_refused(donor: Running) -> None:
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm") as gpu:
        assert gpu._ring is not None
        gpu._free.remove(0)  # slot 0 is the hand-made request's
        first = gpu.submit("echo", np.arange(3))  # numbered 1
        assert first.result(10)[0].tolist() == [0, 1, 2]
        entry = _invoke_chunks(gpu, 1000)
        from concurrent.futures import Future

        replied: Future[tuple[np.ndarray, ...]] = Future()
        gpu._pending[1000] = (replied, time.perf_counter(), 0)
        gpu._ring.post(entry)
        gpu._ring.post(entry)  # the same request again
        refused = wait_for(lambda: _refusal(gpu), 10, "the donor to refuse the replay")
        assert refused.code.value == "bad_sequence"


@pytest.mark.parametrize("receiver", [False, True])
def test_a_future_waits_at_most_the_clients_timeout(receiver: bool) -> None:
    """``Future.result()`` without a timeout of its own once waited for ever."""
    tok = tokens.issue(SECRET, 0xF00D, "rogue", 60)
    rogue = _stalling(tok, lambda sock: None)
    try:
        gpu = _bounded(
            lambda: RemoteGPU(rogue.endpoint, tok, transport="tcp", timeout=1, receiver=receiver),
            30,
        )
        future = gpu.submit("echo", np.arange(3))
        with pytest.raises(DeadlineExceeded):
            _bounded(future.result, 30)
        with pytest.raises(DeadlineExceeded):
            _bounded(future.exception, 30)
        gpu.close()
    finally:
        rogue.release.set()  # type: ignore[attr-defined]
        rogue.close()


@pytest.mark.parametrize(
    ("seconds", "timeval"),
    [(30, (30, 0)), (0.5, (0, 500_000)), (0.9999999, (1, 0)), (0, (0, 1))],
)
def test_read_deadlines_are_valid_timevals(seconds: float, timeval: tuple[int, int]) -> None:
    import struct

    from remote_gpu.transports.tcp import _timeval

    assert struct.unpack("@ll", _timeval(seconds)) == timeval
