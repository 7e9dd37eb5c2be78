"""The client's side of a donor restart, against a real donor: a lost connection is made
again from the lease's directory (which the plugin refreshes), a lost call runs again only
where its function is declared idempotent, and giving up is bounded and typed."""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import REGISTRY

from composable_dra.model import remote_env
from remote_gpu import handshake, idempotency, tokens
from remote_gpu.client import RemoteGPU
from remote_gpu.donor import DonorConfig
from remote_gpu.errors import (
    AuthError,
    CallInterrupted,
    FunctionFailed,
    ReconnectFailed,
    VersionError,
)
from remote_gpu.pool import RemoteGPUPool
from remote_gpu.reconnect import ReconnectingGPU, may_retry, reconnectable
from testbed.wait import wait_for
from tests.unit.remote_gpu.conftest import SECRET, Running, start_donor, stop_donor

ALLOW = {
    "add": "remote_gpu.builtins:add",
    "fail": "remote_gpu.builtins:fail",
    "counter": "remote_gpu.builtins:counter",
    "hangs_once": "tests.unit.remote_gpu.functions:hangs_once",
    "hangs_once_unsafe": "tests.unit.remote_gpu.functions:hangs_once_unsafe",
}


@pytest.fixture(scope="module")
def donor() -> Iterator[Running]:
    config = DonorConfig(name="donor-r", secret=SECRET, allow=ALLOW, memory_quota=8 << 20)
    running, thread = start_donor(config)
    yield running
    stop_donor(running, thread)


def write_lease(directory: Path, endpoint: str, token: tokens.Token) -> None:
    """What the plugin does at prepare and at a refresh: each file replaced by a rename."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens.write(directory / ".token.tmp", token)
    os.replace(directory / ".token.tmp", directory / remote_env.TOKEN)
    (directory / ".endpoint.tmp").write_bytes(remote_env.endpoint_file(endpoint, token.lease))
    os.replace(directory / ".endpoint.tmp", directory / remote_env.ENDPOINT)


def lease_env(directory: Path, transport: str = "tcp") -> dict[str, str]:
    return {"REMOTE_GPU_DIR": str(directory), "REMOTE_GPU_TRANSPORT": transport}


def end_lease(donor: Running, lease: int) -> None:
    """The donor ends the lease's connection (as its restart does), on its own loop."""
    donor.loop.call_soon_threadsafe(donor.donor.revoke, lease, time.time() + 60)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def marker_arg(path: Path) -> np.ndarray:
    return np.frombuffer(str(path).encode(), np.uint8).copy()


def test_the_retry_rules() -> None:
    assert may_retry("matmul", frozenset({"matmul"}))
    assert not may_retry("counter", frozenset({"matmul"}))
    assert reconnectable(ConnectionRefusedError()) and reconnectable(AuthError("old token"))
    assert not reconnectable(VersionError("never")) and not reconnectable(ValueError())


def test_the_donor_names_the_functions_declared_idempotent(donor: Running, tmp_path: Path) -> None:
    write_lease(tmp_path, donor.endpoint, donor.token())
    with RemoteGPU.from_env(lease_env(tmp_path)) as gpu:
        assert gpu.idempotent == {"add", "hangs_once"}
    # A path that does not import is not idempotent (its worker reports it when called).
    assert idempotency.idempotent_names({"x": "no.such.module:f", **ALLOW}) == [
        "add",
        "hangs_once",
    ]


def test_a_client_of_protocol_2_gets_a_reply_it_can_read(donor: Running) -> None:
    # Version 3 added the reply's idempotent list; a v2 client's model refuses unknown
    # fields, so the donor leaves it out at 2 (clients and donors upgrade in any order).
    with RemoteGPU(donor.endpoint, donor.token(), versions=(2,)) as gpu:
        assert gpu.version == 2 and gpu.idempotent == frozenset()
    with RemoteGPU(donor.endpoint, donor.token()) as gpu:
        assert gpu.version == 3 and gpu.idempotent == {"add", "hangs_once"}


def test_the_reply_at_version_2_carries_no_idempotent_field() -> None:
    accept = handshake.Accept(version=2, donor="d", credits=1, transport="tcp", slot_size=1)
    assert "idempotent" not in accept.model_dump_json(exclude_none=True)


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_a_lost_idempotent_call_runs_again_on_the_new_connection(
    donor: Running, tmp_path: Path, transport: str
) -> None:
    lease_dir, marker = tmp_path / "lease", tmp_path / "ran"
    first = donor.token()
    write_lease(lease_dir, donor.endpoint, first)
    retried = sample("remote_gpu_calls_lost_total", outcome="retried")
    with (
        ReconnectingGPU.from_env(lease_env(lease_dir, transport), within=10) as gpu,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        assert gpu.transport == transport
        call = pool.submit(gpu.invoke, "hangs_once", marker_arg(marker))
        wait_for(marker.exists, 10, "the call to run on the donor")
        second = donor.token()
        write_lease(lease_dir, donor.endpoint, second)  # the lease re-opened
        end_lease(donor, first.lease)
        (out,) = call.result(30)
        assert bytes(out) == str(marker).encode()
        assert gpu.lease == second.lease and gpu.reconnects == 1
    assert sample("remote_gpu_calls_lost_total", outcome="retried") == retried + 1


def test_a_lost_call_not_declared_idempotent_fails_typed_and_the_next_reconnects(
    donor: Running, tmp_path: Path
) -> None:
    lease_dir, marker = tmp_path / "lease", tmp_path / "ran"
    first = donor.token()
    write_lease(lease_dir, donor.endpoint, first)
    with (
        ReconnectingGPU.from_env(lease_env(lease_dir), within=10) as gpu,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        call = pool.submit(gpu.invoke, "hangs_once_unsafe", marker_arg(marker))
        wait_for(marker.exists, 10, "the call to run on the donor")
        write_lease(lease_dir, donor.endpoint, donor.token())
        end_lease(donor, first.lease)
        with pytest.raises(CallInterrupted) as lost:
            call.result(30)
        assert lost.value.code == "call_interrupted"
        assert gpu.reconnects == 0  # the next call reconnects
        a = np.ones(4)
        (out,) = gpu.invoke("add", a, a)
        assert np.array_equal(out, a + a) and gpu.reconnects == 1


def test_a_lease_that_is_not_reopened_fails_typed_within_the_bound(
    donor: Running, tmp_path: Path
) -> None:
    first = donor.token()
    write_lease(tmp_path, donor.endpoint, first)
    a = np.ones(4)
    with ReconnectingGPU.from_env(lease_env(tmp_path), within=0.5) as gpu:
        gpu.invoke("add", a, a)
        worker = donor.donor.leases[first.lease].proc
        assert worker is not None
        end_lease(donor, first.lease)
        wait_for(lambda: not worker.is_alive(), 10, "the lease's worker to end")
        started = time.monotonic()
        with pytest.raises(ReconnectFailed) as failed:
            gpu.invoke("add", a, a)  # the old token opens nothing: tried, then given up
        assert time.monotonic() - started < 0.5 + 2.0
        assert isinstance(failed.value.__cause__, AuthError)


def test_a_functions_own_error_is_not_a_lost_connection(donor: Running, tmp_path: Path) -> None:
    write_lease(tmp_path, donor.endpoint, donor.token())
    with ReconnectingGPU.from_env(lease_env(tmp_path)) as gpu:
        with pytest.raises(FunctionFailed):
            gpu.invoke("fail", np.ones(2))
        (n,) = gpu.invoke("counter")
        assert gpu.reconnects == 0 and int(n[0]) >= 1


def test_the_pool_rides_out_a_lost_lease(donor: Running, tmp_path: Path) -> None:
    env = {"REMOTE_GPUS": "0,1", "REMOTE_GPU_TRANSPORT": "tcp"}
    firsts = []
    for i in range(2):
        token = donor.token()
        write_lease(tmp_path / str(i), donor.endpoint, token)
        env[remote_env.names(i).directory] = str(tmp_path / str(i))
        firsts.append(token.lease)
    pairs = [(np.full(8, i, np.float32), np.ones(8, np.float32)) for i in range(8)]
    with RemoteGPUPool.from_env(env, per_lease=1, within=10) as pool:
        assert pool.leases == firsts
        assert [float(p[0]) for (p,) in pool.map("add", pairs)] == [i + 1.0 for i in range(8)]
        write_lease(tmp_path / "0", donor.endpoint, donor.token())
        end_lease(donor, firsts[0])
        assert [float(p[0]) for (p,) in pool.map("add", pairs)] == [i + 1.0 for i in range(8)]
        assert pool.leases[0] != firsts[0] and pool.leases[1] == firsts[1]
