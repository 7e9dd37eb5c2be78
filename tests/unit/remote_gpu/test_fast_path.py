"""The fast paths: TCP connections served by the lease's worker, shared-memory rings."""

from __future__ import annotations

import gc
import os
import socket
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from remote_gpu.client import RemoteGPU
from remote_gpu.donor import DonorConfig
from remote_gpu.errors import (
    FrameError,
    MemoryQuotaExceeded,
    NotAllowed,
    RateLimited,
    RemoteGPUError,
)
from remote_gpu.protocol import DType, Flags, Header, Op
from remote_gpu.transports.tcp import Reader, TcpClientTransport
from testbed.wait import wait_for

from .conftest import ALLOW, SECRET, Running, start_donor, stop_donor


def _refusal(gpu: RemoteGPU) -> RemoteGPUError | None:
    """The error the donor answered with, if it has by now (heartbeats read it)."""
    try:
        gpu.heartbeat()
    except RemoteGPUError as exc:
        return exc
    return None


def _invoke_chunks(
    gpu: RemoteGPU, seq: int, *, key: bytes | None = None, slot_offset: int = 0, offset: int = 0
) -> list[bytes]:
    """The frames of an INVOKE of echo on 16 bytes, with knobs to make them wrong."""
    key = gpu._key if key is None else key
    head = Header(Op.INVOKE, gpu.lease, seq, parts=1, offset=slot_offset, length=4)
    arr = Header(
        Op.INVOKE,
        gpu.lease,
        seq,
        flags=Flags.SHM,
        dtype=DType.UINT8,
        part=1,
        parts=1,
        shape=(16,),
        offset=offset,
        length=16,
    )
    return [head.pack(key), b"echo", arr.pack(key)]


def test_shared_memory_requests_go_through_the_ring(donor: Running) -> None:
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm") as gpu:
        assert gpu._ring is not None
        lease = donor.donor.leases[gpu.lease]
        assert lease.ring and lease.proc is not None
        futures = [gpu.submit("add", np.full(3, i), np.ones(3, dtype=np.int64)) for i in range(12)]
        assert [int(f.result(10)[0][0]) for f in futures] == [i + 1 for i in range(12)]
        assert gpu.heartbeat() < 5  # the control channel still answers
        (big,) = gpu.invoke("echo", np.arange(100_000, dtype=np.float64))
        assert big[-1] == 99_999.0


def test_result_views_pin_their_slot_until_dropped(donor: Running) -> None:
    with RemoteGPU(
        donor.endpoint, donor.token(), transport="shm", views=True, credits=2, timeout=10
    ) as gpu:
        # The handshake starts the lease's worker process (seconds on a loaded machine);
        # the waits for a pinned slot below should give up quickly.
        gpu.timeout = 0.5
        assert gpu.arena is not None
        (first,) = gpu.invoke("echo", np.arange(8, dtype=np.int32))
        (second,) = gpu.invoke("echo", np.arange(8, 16, dtype=np.int32))
        # Both are views of the arena, not copies.
        for view in (first, second):
            assert np.shares_memory(view, gpu.arena.buf)
        assert first.tolist() == list(range(8)) and second.tolist() == list(range(8, 16))
        with pytest.raises(TimeoutError, match="held by result views"):
            gpu.submit("echo", np.zeros(8, dtype=np.int32))
        tail = first[4:]  # a view of a view keeps the slot pinned as well
        del first
        gc.collect()
        with pytest.raises(TimeoutError):
            gpu.submit("echo", np.zeros(8, dtype=np.int32))
        assert tail.tolist() == [4, 5, 6, 7]  # not overwritten meanwhile
        del tail
        (third,) = gpu.invoke("echo", np.full(8, 7, dtype=np.int32))
        assert third.tolist() == [7] * 8 and second.tolist() == list(range(8, 16))


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_allow_list_and_rate_quota_hold_on_the_fast_paths(transport: str) -> None:
    config = DonorConfig(name="rated", secret=SECRET, allow=ALLOW, rate_limit=1.0, rate_burst=2)
    running, thread = start_donor(config)
    try:
        with RemoteGPU(running.endpoint, running.token(), transport=transport) as gpu:
            assert (gpu._ring is not None) == (transport == "shm")
            with pytest.raises(NotAllowed):
                gpu.invoke("os:system", np.zeros(1))
            gpu.invoke("echo", np.arange(1))
            gpu.invoke("echo", np.arange(1))
            with pytest.raises(RateLimited):
                gpu.invoke("echo", np.arange(1))
        # The worker's refusals reach the donor's metrics.
        assert wait_for(
            lambda: _errors("rate_limited") >= 1 and _errors("not_allowed") >= 1,
            10,
            "the donor to count the refusals",
        )
    finally:
        stop_donor(running, thread)


def _errors(code: str) -> float:
    from prometheus_client import REGISTRY

    return (
        REGISTRY.get_sample_value("remote_gpu_errors_total", {"side": "donor", "code": code}) or 0
    )


@pytest.mark.parametrize(
    ("knobs", "code"),
    [
        ({"key": b"f" * 32}, "bad_frame"),  # a frame MACed with another session's key
        ({"slot_offset": 1}, "bad_frame"),  # not a slot's base
        ({"slot_offset": 1 << 40}, "bad_frame"),  # beyond the arena
        ({"offset": "next-slot"}, "memory_quota"),  # an array outside the request's slot
    ],
)
def test_a_bad_ring_entry_ends_only_that_lease(
    donor: Running, knobs: dict[str, object], code: str
) -> None:
    with (
        RemoteGPU(donor.endpoint, donor.token(), transport="shm") as victim,
        RemoteGPU(donor.endpoint, donor.token(), transport="shm") as bystander,
    ):
        assert victim._ring is not None and victim.arena is not None
        if knobs.get("offset") == "next-slot":
            knobs = {"offset": victim.arena.slot_size}
        victim._ring.post(_invoke_chunks(victim, 77, **knobs))  # type: ignore[arg-type]
        refused = wait_for(lambda: _refusal(victim), 10, "the donor to refuse the entry")
        assert refused.code.value == code
        with pytest.raises(RemoteGPUError):
            victim.invoke("echo", np.arange(2))
        assert bystander.invoke("echo", np.arange(3))[0].tolist() == [0, 1, 2]
        wait_for(lambda: victim.lease not in donor.donor.leases, 10, "the lease to end")


def test_garbage_in_the_ring_and_stray_doorbells(donor: Running) -> None:
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm") as gpu:
        assert gpu._ring is not None and gpu.arena is not None
        requests, _ = gpu.arena.doorbells()
        fd = os.open(requests, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(fd, b"ring ring ring")  # a doorbell with nothing behind it is harmless
        finally:
            os.close(fd)
        assert gpu.invoke("echo", np.arange(4))[0].tolist() == [0, 1, 2, 3]
        gpu._ring.post([os.urandom(200)])
        refused = wait_for(lambda: _refusal(gpu), 10, "the donor to refuse the entry")
        assert refused.code.value == "bad_frame"


def test_invoke_on_the_control_channel_of_a_ring_lease_is_refused(donor: Running) -> None:
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm") as gpu:
        gpu._tr.send_frames([(c, None) for c in _invoke_chunks(gpu, 5)[:1]])
        refused = wait_for(lambda: _refusal(gpu), 10, "the donor to refuse the entry")
        assert refused.code.value == "bad_frame"


def test_a_ring_entry_must_fit() -> None:
    from remote_gpu.ring import ENTRY

    config = DonorConfig(name="fit", secret=SECRET, allow=ALLOW)
    running, thread = start_donor(config)
    try:
        with RemoteGPU(running.endpoint, running.token(), transport="shm") as gpu:
            assert gpu._ring is not None
            with pytest.raises(FrameError, match="does not fit"):
                gpu._ring.post([bytes(ENTRY)])
            with pytest.raises(MemoryQuotaExceeded):
                gpu.invoke("big", np.array([gpu.slot_size], dtype=np.int64))
            assert gpu.invoke("echo", np.arange(2))[0].tolist() == [0, 1]
    finally:
        stop_donor(running, thread)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_close_cleans_up(donor: Running, transport: str) -> None:
    gpu = RemoteGPU(donor.endpoint, donor.token(), transport=transport)
    gpu.invoke("echo", np.arange(3))
    lease = donor.donor.leases[gpu.lease]
    proc, arena = lease.proc, lease.arena
    assert proc is not None and proc.is_alive()
    files = [arena.path, *arena.doorbells()] if transport == "shm" else [arena.path]
    assert all(Path(f).exists() for f in files)
    gpu.close()
    wait_for(lambda: gpu.lease not in donor.donor.leases, 10, "the donor to end the lease")
    wait_for(lambda: not proc.is_alive(), 10, "the worker to exit")
    wait_for(lambda: not any(Path(f).exists() for f in files), 10, "the arena to be removed")
    with pytest.raises(RemoteGPUError):
        gpu.invoke("echo", np.arange(1))


@pytest.mark.parametrize("receiver", [False, None])
def test_large_payloads_in_flight_both_ways_do_not_deadlock(receiver: bool | None) -> None:
    """Without a receiver thread, a client blocked sending must read the replies that
    block the worker (which serves requests in order) from sending; by default, the first
    large payload starts a receiver thread."""
    config = DonorConfig(name="wide", secret=SECRET, allow=ALLOW, memory_quota=160 << 20)
    running, thread = start_donor(config)
    try:
        with RemoteGPU(
            running.endpoint, running.token(), transport="tcp", receiver=receiver
        ) as gpu:
            assert gpu._receiver is None and gpu.slot_size >= 24 << 20
            assert gpu.invoke("echo", np.arange(3))[0].tolist() == [0, 1, 2]
            payload = np.arange(3 << 20, dtype=np.int64)  # 24 MiB, 4 in flight each way
            futures = [gpu.submit("echo", payload + i) for i in range(8)]
            for i, f in enumerate(futures):
                assert f.result(30)[0][-1] == payload[-1] + i
            assert (gpu._receiver is not None) == (receiver is None)
            assert gpu.invoke("echo", np.arange(3))[0].tolist() == [0, 1, 2]
    finally:
        stop_donor(running, thread)


def _is_view(result: np.ndarray, gpu: RemoteGPU) -> bool:
    assert gpu.arena is not None
    return bool(np.shares_memory(result, gpu.arena.buf))


def test_results_are_views_while_few_are_held_then_copies(donor: Running) -> None:
    """By default a shared-memory result is a view of its slot as long as views leave a
    slot free; past that, copies, so that holding any number of results never stalls the
    calls that follow."""
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm", credits=4) as gpu:
        held = [gpu.invoke("echo", np.full(8, i, dtype=np.int64))[0] for i in range(10)]
        assert [_is_view(r, gpu) for r in held] == [True] * 3 + [False] * 7
        assert [r.tolist() for r in held] == [[i] * 8 for i in range(10)]
        futures = [gpu.submit("echo", np.full(4, i, dtype=np.int64)) for i in range(20)]
        assert [f.result(10)[0][0] for f in futures] == list(range(20))
        assert [r.tolist() for r in held] == [[i] * 8 for i in range(10)]  # untouched
        del held, futures
        gc.collect()
        (again,) = gpu.invoke("echo", np.arange(3))
        assert _is_view(again, gpu) and again.tolist() == [0, 1, 2]


def test_views_false_always_copies(donor: Running) -> None:
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm", views=False) as gpu:
        results = [gpu.invoke("echo", np.arange(i + 1))[0] for i in range(6)]
        assert not any(_is_view(r, gpu) for r in results)
        assert [r.tolist() for r in results] == [list(range(i + 1)) for i in range(6)]


def test_threads_share_a_ring_client(donor: Running) -> None:
    """Several threads submit, wait and hold results on one client at once."""
    errors: list[BaseException] = []
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm", credits=4) as gpu:

        def work(k: int) -> None:
            try:
                kept: list[np.ndarray] = []
                for i in range(150):
                    a = np.full(1000, k * 1000 + i, dtype=np.int32)
                    if i % 3:
                        (out,) = gpu.invoke("echo", a)
                    else:
                        (out,) = gpu.submit("add", a, np.ones_like(a)).result(10)
                        a = a + 1
                    assert (out == a).all()
                    kept = [*kept[-2:], out]  # hold a few results a while
                    assert all((r == r[0]).all() for r in kept)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    assert not errors, errors


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_client_metrics_count_every_call(donor: Running, transport: str) -> None:
    """Clients add up calls, bytes and latencies and hand them to the metrics now and then
    and when they close: none is lost."""
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    def moved(direction: str) -> float:
        return sample(
            "remote_gpu_bytes_total", side="client", direction=direction, transport=transport
        )

    calls = sample("remote_gpu_invocations_total", side="client")
    latencies = sample("remote_gpu_invoke_seconds_count", side="client")
    out, back = moved("out"), moved("in")
    with RemoteGPU(donor.endpoint, donor.token(), transport=transport) as gpu:
        for _ in range(600):
            gpu.invoke("echo", np.zeros(100, dtype=np.uint8))
        futures = [gpu.submit("echo", np.zeros(100, dtype=np.uint8)) for _ in range(100)]
        for f in futures:
            f.result(10)
    assert sample("remote_gpu_invocations_total", side="client") - calls == 700
    assert sample("remote_gpu_invoke_seconds_count", side="client") - latencies == 700
    assert moved("out") == out + 70_000
    assert moved("in") == back + 70_000


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_results_that_are_arguments_keep_their_own_shape(transport: str) -> None:
    allow = {
        **ALLOW,
        "reshape": "tests.unit.remote_gpu.functions:reshape_in_place",
        "both": "tests.unit.remote_gpu.functions:both",
    }
    running, thread = start_donor(DonorConfig(name="shapes", secret=SECRET, allow=allow))
    try:
        with RemoteGPU(running.endpoint, running.token(), transport=transport) as gpu:
            (out,) = gpu.invoke("reshape", np.arange(6, dtype=np.float32))
            assert out.shape == (2, 3) and out.tolist() == [[0, 1, 2], [3, 4, 5]]
            same, more = gpu.invoke("both", np.arange(4, dtype=np.int16))
            assert same.tolist() == [0, 1, 2, 3] and more.tolist() == [1, 2, 3, 4]
    finally:
        stop_donor(running, thread)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_worker_that_never_spins_is_woken_for_every_request(transport: str) -> None:
    """With no spinning, the worker sleeps after each request (on its ring's doorbell, or
    in poll on its TCP connection): every one of them must wake it."""
    config = DonorConfig(name="sleepy", secret=SECRET, allow=ALLOW, spin=0.0)
    running, thread = start_donor(config)
    try:
        with RemoteGPU(running.endpoint, running.token(), transport=transport, timeout=10) as gpu:
            for i in range(300):
                assert gpu.invoke("echo", np.array([i]))[0][0] == i
            futures = [gpu.submit("echo", np.array([i])) for i in range(40)]
            assert [f.result(10)[0][0] for f in futures] == list(range(40))
    finally:
        stop_donor(running, thread)


def test_a_tcp_caller_that_spins_takes_its_reply_without_sleeping(donor: Running) -> None:
    """A TCP caller watching its socket for longer than the reply takes never sleeps in
    poll; one that does not spin sleeps there for every reply."""
    for spin, sleeps in ((10.0, False), (0.0, True)):
        with RemoteGPU(donor.endpoint, donor.token(), transport="tcp", spin=spin) as gpu:
            tr = gpu._tr
            assert isinstance(tr, TcpClientTransport)
            polls: list[int | None] = []
            poll = tr._poll.poll

            def counted(ms: int | None = None, poll: Any = poll, polls: list[Any] = polls) -> Any:
                polls.append(ms)
                return poll(ms)

            tr._poll = SimpleNamespace(poll=counted)  # type: ignore[assignment]
            for i in range(50):
                assert gpu.invoke("echo", np.array([i]))[0][0] == i
            assert bool(polls) if sleeps else polls == []


def test_tcp_reader_spin_sees_bytes_that_come_while_it_looks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b = socket.socketpair()
    with a, b:
        reader = Reader(a)
        assert not reader.spin(0.0)  # nothing there, and no time to wait
        looks = 0

        def peer_writes_on_the_third_look() -> None:
            nonlocal looks
            looks += 1
            if looks == 3:
                b.send(b"hello")

        monkeypatch.setattr(os, "sched_yield", peer_writes_on_the_third_look)
        assert reader.spin(30.0)
        assert looks == 3 and reader.read(5) == b"hello"
        b.send(b"x")
        assert reader.spin(0.0)  # there already: no look needed
        assert looks == 3


def test_close_unmaps_the_arena_unless_views_are_held(donor: Running) -> None:
    gpu = RemoteGPU(donor.endpoint, donor.token(), transport="shm")
    gpu.invoke("echo", np.arange(4))
    gpu.close()
    assert gpu.arena is not None and gpu.arena._mmap.closed
    gpu = RemoteGPU(donor.endpoint, donor.token(), transport="shm")
    (kept,) = gpu.invoke("echo", np.arange(4))
    assert _is_view(kept, gpu)
    gpu.close()
    assert kept.tolist() == [0, 1, 2, 3]  # still mapped: the view holds the mapping


def test_a_caller_that_spins_takes_its_reply_without_a_doorbell(donor: Running) -> None:
    """A caller watching the ring for longer than the reply takes never says it may sleep,
    so the worker never rings its doorbell; one that does not spin sleeps on it."""
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm", spin=10.0) as gpu:
        ring = gpu._ring
        assert ring is not None
        for i in range(50):
            assert gpu.invoke("echo", np.array([i]))[0][0] == i
        with pytest.raises(BlockingIOError):
            os.read(ring._in_fd, 1)  # not one byte: the worker never rang
        assert ring._counters[ring._asleep] == 0
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm", spin=0.0) as gpu:
        ring = gpu._ring
        assert ring is not None
        asleep: list[bool] = []
        wait = ring.wait

        def watched(timeout: float | None, *others: int, spin: float = 0.0) -> list[int]:
            asleep.append(spin == 0.0)
            return wait(timeout, *others, spin=spin)

        ring.wait = watched  # type: ignore[method-assign]
        for i in range(20):
            assert gpu.invoke("echo", np.array([i]))[0][0] == i
        assert asleep and all(asleep)


def test_a_ring_caller_reads_the_control_channel_only_when_a_wait_wakes_for_it(
    donor: Running,
) -> None:
    """Replies that come through the ring cost no look at the control channel (a look was
    a failed read and a poll, per call); its frames are still read once a wait wakes for
    them, here a heartbeat's reply to a caller that sleeps at once."""
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm", spin=10.0) as gpu:
        looks: list[float | None] = []
        wait_readable = gpu._tr.wait_readable

        def counted(timeout: float | None, spin: float = 0.0) -> bool:
            looks.append(timeout)
            return wait_readable(timeout, spin)

        gpu._tr.wait_readable = counted  # type: ignore[method-assign]
        for i in range(50):
            assert gpu.invoke("echo", np.array([i]))[0][0] == i
        assert looks == []
    with RemoteGPU(donor.endpoint, donor.token(), transport="shm", spin=0.0) as gpu:
        assert gpu.invoke("echo", np.array([1]))[0][0] == 1
        assert gpu.heartbeat() < 5
