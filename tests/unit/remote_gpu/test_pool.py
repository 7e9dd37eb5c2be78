"""RemoteGPUPool: calls spread over a pod's leases, bounded in flight, results in order;
and ``RemoteGPU.all_from_env`` against a real donor."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from remote_gpu import tokens
from remote_gpu.client import RemoteGPU, Result
from remote_gpu.errors import AuthError, DeadlineExceeded, LeaseBusy, RemoteGPUError
from remote_gpu.pool import RemoteGPUPool, pick
from testbed.wait import wait_for

from .conftest import Running


def test_pick_takes_the_least_busy_lease_and_ties_in_turn() -> None:
    assert pick([0, 0, 0], 2, 0) == 0
    assert pick([0, 0, 0], 2, 1) == 1
    assert pick([1, 0, 1], 2, 0) == 1
    assert pick([2, 1, 1], 2, 0) == 1
    assert pick([2, 1, 1], 2, 2) == 2
    assert pick([2, 2], 2, 0) is None


class Held:
    """A lease whose calls wait until the test lets them go; it notes what it got."""

    def __init__(self, lease: int, started: threading.Semaphore | None = None) -> None:
        self.lease = lease
        self.started = started or threading.Semaphore(0)
        self.go: dict[int, threading.Event] = {}
        self.got: list[int] = []
        self.closed = False
        self._lock = threading.Lock()

    def release(self, value: int) -> None:
        with self._lock:
            self.go.setdefault(value, threading.Event()).set()

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        value = int(arrays[0][0])
        with self._lock:
            self.got.append(value)
            go = self.go.setdefault(value, threading.Event())
        self.started.release()
        assert go.wait(10), f"call {value} never let go"
        return (arrays[0] * 10 + self.lease,)

    def close(self) -> None:
        self.closed = True


def started(lease: Held, n: int) -> None:
    for _ in range(n):
        assert lease.started.acquire(timeout=10)


def test_calls_spread_over_the_leases_and_wait_for_a_free_place() -> None:
    leases = [Held(i) for i in range(4)]
    pool = RemoteGPUPool(leases, per_lease=1, timeout=0.2)
    futures = [pool.submit("f", np.array([v])) for v in range(4)]
    for lease in leases:
        started(lease, 1)
    assert sorted(len(lease.got) for lease in leases) == [1, 1, 1, 1]
    # Every lease has its one call in flight: a fifth waits, then is refused in time.
    with pytest.raises(DeadlineExceeded, match="in flight"):
        pool.submit("f", np.array([9]))
    # One lease's call done: the next call goes there, not onto a busy one.
    busy = next(lease for lease in leases if lease.got == [1])
    busy.release(1)
    assert int(futures[1].result(10)[0][0]) == 10 + busy.lease
    later = pool.submit("f", np.array([5]))
    started(busy, 1)
    assert busy.got == [1, 5]
    for v in (0, 2, 3, 5):
        for lease in leases:
            lease.release(v)
    assert int(later.result(10)[0][0]) == 50 + busy.lease
    calls = pool.calls_by_lease()
    assert calls[busy.lease] == 2 and sorted(calls.values()) == [1, 1, 1, 2]
    pool.close()
    assert all(lease.closed for lease in leases)


def test_map_yields_in_call_order_though_later_calls_finish_first() -> None:
    started = threading.Semaphore(0)
    leases = [Held(0, started), Held(1, started)]
    with RemoteGPUPool(leases, per_lease=2) as pool:
        for v in range(1, 8):  # every call but the first may finish at once
            for lease in leases:
                lease.release(v)
        results = pool.map("f", ([np.array([v])] for v in range(8)))
        out: list[int] = []
        consumer = threading.Thread(
            target=lambda: out.extend(int(r[0][0]) // 10 for r in results), daemon=True
        )
        consumer.start()
        for _ in range(8):  # all eight ran (seven of them finished) while call 0 is held
            assert started.acquire(timeout=10)
        assert out == []
        for lease in leases:
            lease.release(0)
        consumer.join(10)
        assert out == list(range(8))
        assert sum(pool.calls_by_lease().values()) == 8


def test_map_unordered_yields_as_calls_complete() -> None:
    leases = [Held(0), Held(1)]
    with RemoteGPUPool(leases, per_lease=1) as pool:
        leases[0].release(1)
        leases[1].release(1)
        results = pool.map("f", ([np.array([v])] for v in range(2)), ordered=False)
        first = int(next(results)[0][0]) // 10
        assert first == 1  # call 0 is still held
        for lease in leases:
            lease.release(0)
        assert int(next(results)[0][0]) // 10 == 0


def test_a_pool_needs_a_lease() -> None:
    with pytest.raises(ValueError, match="at least one lease"):
        RemoteGPUPool([])


def lease_env(donor: Running, path: Path, count: int) -> tuple[dict[str, str], list[int]]:
    env = {"REMOTE_GPUS": ",".join(map(str, range(count))), "REMOTE_GPU_TRANSPORT": "tcp"}
    ids = []
    for i in range(count):
        tok = donor.token()
        tokens.write(path / f"t{i}", tok)
        env |= {
            f"REMOTE_GPU_{i}_ENDPOINT": donor.endpoint,
            f"REMOTE_GPU_{i}_TOKEN_FILE": str(path / f"t{i}"),
            f"REMOTE_GPU_{i}_LEASE": str(tok.lease),
        }
        ids.append(tok.lease)
    return env, ids


def test_all_from_env_opens_every_lease_and_the_pool_uses_each(
    donor: Running, tmp_path: Path
) -> None:
    env, ids = lease_env(donor, tmp_path, 3)
    rng = np.random.default_rng(0)
    pairs = [
        (rng.standard_normal((32, 32), dtype=np.float32), np.full((32, 32), i, np.float32))
        for i in range(12)
    ]
    with RemoteGPUPool.from_env(env, per_lease=2) as pool:  # two threads on each client
        assert pool.leases == ids
        sums = list(pool.map("add", pairs))
        assert all(np.array_equal(p, a + b) for (p,), (a, b) in zip(sums, pairs, strict=True))
        assert all(n >= 1 for n in pool.calls_by_lease().values())


def test_all_from_env_closes_what_it_opened_when_a_lease_fails(
    donor: Running, tmp_path: Path
) -> None:
    env, _ = lease_env(donor, tmp_path, 2)
    env["REMOTE_GPU_1_LEASE"] = "1"
    with pytest.raises(RemoteGPUError, match="REMOTE_GPU_1_LEASE does not match"):
        RemoteGPU.all_from_env(env)
    # Lease 0 was opened, then closed again: not busy (one connection per lease) but spent.
    first = {
        "REMOTE_GPU_ENDPOINT": env["REMOTE_GPU_0_ENDPOINT"],
        "REMOTE_GPU_TOKEN_FILE": env["REMOTE_GPU_0_TOKEN_FILE"],
        "REMOTE_GPU_TRANSPORT": "tcp",
    }

    def spent() -> bool:
        """True once the donor has seen the close (until then the lease is still busy)."""
        try:
            RemoteGPU.from_env(first).close()
        except LeaseBusy:
            return False
        except AuthError as exc:
            return "has closed" in str(exc)
        raise AssertionError("lease 0 was left open")

    wait_for(spent, 10, "the donor to see lease 0 closed")


def test_all_from_env_refuses_a_bad_list_or_none() -> None:
    with pytest.raises(RemoteGPUError, match="REMOTE_GPUS"):
        RemoteGPU.all_from_env({"REMOTE_GPUS": "0,x"})
    with pytest.raises(RemoteGPUError, match="not set"):
        RemoteGPU.all_from_env({})


def test_a_pool_that_does_not_own_its_leases_leaves_them_open() -> None:
    leases = [Held(0), Held(1)]
    for lease in leases:
        lease.release(3)
    with RemoteGPUPool(leases, per_lease=1, owns=False) as pool:
        assert int(pool.invoke("f", np.array([3]))[0][0]) // 10 == 3
    assert not any(lease.closed for lease in leases)
