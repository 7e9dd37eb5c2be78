"""The UCX transport end to end, over UCX's tcp transport on loopback (no GPU, no RDMA).

The donor runs as its own process (``remote-gpu-donor --ucx-port``), as in production; the
client connects with a ``ucx://`` endpoint. ``ucxx`` comes with the ``ucx`` extra, which
``make install`` installs.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from remote_gpu import tokens
from remote_gpu.client import RemoteGPU
from remote_gpu.errors import NotAllowed
from testbed.process import donor_argv
from testbed.wait import wait_for

from .conftest import SECRET

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ucx_donor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    secret = tmp_path_factory.mktemp("ucx") / "secret"
    secret.write_bytes(SECRET)
    tcp_port, ucx_port = _free_port(), _free_port()
    cmd = donor_argv(
        "ucx-donor",
        secret,
        f"127.0.0.1:{tcp_port}",
        "--ucx-port",
        str(ucx_port),
        "--transports",
        "ucx,tcp",
        "--allow",
        "echo=remote_gpu.builtins:echo",
        "--allow",
        "add=remote_gpu.builtins:add",
        log_level="info",  # its "ucx listening" line says when it is ready
    )
    log = secret.parent / "donor.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, "UCX_TLS": "tcp", "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=out,
        )
    try:
        # Its UCX listener opens after the tcp one (ucxx's import is slow on a busy machine).
        wait_for(
            lambda: proc.poll() is not None or b"ucx listening" in log.read_bytes(),
            60,
            "the donor's UCX listener",
            describe=lambda: log.read_text(errors="replace"),
        )
        assert proc.poll() is None, "the donor exited"
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("UCX_TLS", "tcp")  # this process's UCX too: loopback over UCX's tcp
            yield tcp_port, ucx_port
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0, "SIGTERM should shut the donor down cleanly"


def _token(lease: int) -> tokens.Token:
    return tokens.issue(SECRET, lease, "ucx-donor", 60)


def _connect(port: int, lease: int) -> RemoteGPU | None:
    try:
        return RemoteGPU(f"ucx://127.0.0.1:{port}", _token(lease), transport="ucx", timeout=10)
    except (OSError, RuntimeError):
        return None  # the UCX listener comes up just after the TCP one


def test_invoke_over_ucx(ucx_donor: tuple[int, int]) -> None:
    _, ucx_port = ucx_donor
    # A fresh lease per try: a try that got as far as the handshake has used its token
    # (a closed lease's token stays dead).
    leases = itertools.count(501)
    gpu = wait_for(lambda: _connect(ucx_port, next(leases)), 30, "a UCX connection")
    with gpu:
        assert gpu.transport == "ucx"
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        (out,) = gpu.invoke("add", a, a)
        np.testing.assert_array_equal(out, 2 * a)
        big = np.arange(1 << 18, dtype=np.int64)  # 2 MiB, several UCX messages
        futures = [gpu.submit("echo", big + i) for i in range(6)]
        for i, f in enumerate(futures):
            np.testing.assert_array_equal(f.result(10)[0], big + i)
        with pytest.raises(NotAllowed):
            gpu.invoke("os:system", np.zeros(1))
        assert gpu.heartbeat() < 5


def test_a_silent_ucx_donor_times_the_client_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every wait of a UCX client ends after its ``timeout`` (it once waited for ever)."""
    import asyncio
    import threading
    import time

    import ucxx

    from remote_gpu.errors import DeadlineExceeded

    monkeypatch.setenv("UCX_TLS", "tcp")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    quiet = asyncio.Event()

    async def handler(endpoint: object) -> None:
        await quiet.wait()  # accepts, and never says a word

    async def start() -> object:
        return ucxx.create_listener(handler, 0)

    listener: Any = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    endpoint = f"ucx://127.0.0.1:{listener.port}"
    outcome: list[BaseException] = []

    def connect() -> None:
        try:
            RemoteGPU(endpoint, _token(502), transport="ucx", timeout=1)
        except BaseException as exc:
            outcome.append(exc)

    try:
        started = time.monotonic()
        client = threading.Thread(target=connect, daemon=True)
        client.start()
        client.join(30)
        assert not client.is_alive(), "the client still waits"
        assert len(outcome) == 1 and isinstance(outcome[0], DeadlineExceeded), outcome
        assert time.monotonic() - started < 15
    finally:
        loop.call_soon_threadsafe(quiet.set)
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.2), loop).result(10)  # handler ends
        del listener
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
