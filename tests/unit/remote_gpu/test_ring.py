"""The shared-memory rings on their own: doorbells only for a sleeping peer, no lost
wake-ups, and a spinner that backs off once it has lost its CPU."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from remote_gpu import ring as ring_module
from remote_gpu.arena import Arena
from remote_gpu.ring import Ring, ctl_size
from testbed.wait import wait_for

ENTRIES = 4


@pytest.fixture
def rings() -> Iterator[tuple[Ring, Ring]]:
    arena = Arena.create(1 << 20, ENTRIES, ctl_size(ENTRIES))
    client, worker = Ring(arena, ENTRIES, "client"), Ring(arena, ENTRIES, "worker")
    yield client, worker
    client.close()
    worker.close()
    arena.close()


def _doorbell_bytes(ring: Ring) -> int:
    """Bytes waiting in the FIFO that wakes ``ring``'s side (drains it)."""
    n = 0
    try:
        while chunk := os.read(ring._in_fd, 4096):
            n += len(chunk)
    except BlockingIOError:
        pass
    return n


def test_posting_to_a_busy_peer_rings_no_doorbell(rings: tuple[Ring, Ring]) -> None:
    client, worker = rings
    for i in range(3):
        client.post(b"request %d" % i)
    assert _doorbell_bytes(worker) == 0  # the worker never said it might sleep
    assert [worker.take() for _ in range(3)] == [b"request 0", b"request 1", b"request 2"]
    worker.post(b"response")
    assert _doorbell_bytes(client) == 0
    assert client.take() == b"response"


def _await(ring: Ring) -> bool:
    """Wait for a message as the library does (a wake-up may find nothing: wait again);
    False if it took so long that a wake-up must have been lost."""
    deadline = time.monotonic() + 5.0
    while not ring.ready():
        if time.monotonic() > deadline:
            return False
        ring.wait(10.0)
    return True


def test_a_sleeping_peer_is_woken_every_time(rings: tuple[Ring, Ring]) -> None:
    """Both sides sleep (no spin) whenever nothing is there; each post must wake the
    other side, or the sleeper waits out its timeout."""
    client, worker = rings
    got: list[bytes] = []
    lost: list[int] = []

    def serve() -> None:
        while len(got) < 300:
            if not _await(worker):
                lost.append(len(got))
                return
            got.append(worker.take())
            worker.post(b"ok")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        for i in range(300):
            client.post(b"%d" % i)
            assert _await(client), f"lost wake-up of the client at {i}"
            assert client.take() == b"ok"
    finally:
        thread.join(10)
    assert not lost and not thread.is_alive()
    assert got == [b"%d" % i for i in range(300)]


def test_the_sleeper_raises_its_flag_and_lowers_it_on_waking(rings: tuple[Ring, Ring]) -> None:
    client, worker = rings
    woken = threading.Event()

    def sleep() -> None:
        worker.wait(10.0)
        woken.set()

    thread = threading.Thread(target=sleep)
    thread.start()
    wait_for(lambda: worker._counters[worker._asleep], 10, "the worker to raise its flag", 0.001)
    assert not woken.is_set()
    client.post(b"wake up")  # sees the flag: rings the doorbell
    assert woken.wait(10)
    thread.join(10)
    assert worker._counters[worker._asleep] == 0
    assert worker.take() == b"wake up"


def test_a_spinner_yields_its_cpu_between_looks_and_sleeps_after_spin(
    rings: tuple[Ring, Ring], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While it spins, ``wait`` gives its CPU away between two looks at the counter (on a
    busy machine the peer may need that CPU to answer), and after ``spin`` seconds it
    raises its flag and sleeps; a message posted meanwhile ends the spin, no sleep."""
    client, worker = rings
    now = 0.0
    yields = 0

    def clock() -> float:
        return now

    def yield_cpu() -> None:
        nonlocal now, yields
        yields += 1
        now += 1e-4
        assert not worker._counters[worker._asleep]  # spinning, not asleep

    monkeypatch.setattr(ring_module, "_clock", clock)
    monkeypatch.setattr(ring_module, "_yield", yield_cpu)
    assert worker.wait(0.0, spin=0.001) == []
    assert yields == 10  # 1 ms of looks, 0.1 ms apart, then the (timed-out) sleep
    assert not worker.ready()

    def post_on_third() -> None:
        nonlocal yields
        yields += 1
        if yields == 3:
            client.post(b"meanwhile")

    yields = 0
    monkeypatch.setattr(ring_module, "_yield", post_on_third)
    assert worker.wait(10.0, spin=1.0) == []  # the clock stands still: only the post ends it
    assert yields == 3 and worker.ready()
    assert worker.take() == b"meanwhile"
