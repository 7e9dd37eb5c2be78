"""End to end: a real donor process over real TCP on 127.0.0.1, flooded with half-open
connections (connected, never a HELLO) well past its descriptor limit. The donor holds at
most half its descriptors in connections and refuses the rest at once; should accept()
still fail (EMFILE: the limit lowered after the donor sized its budget), it backs off and
keeps accepting. Either way it drops every half-open connection, at once or after its
handshake timeout, and then serves a good client.

Before the first fix the first EMFILE ended the donor's accept task for good while the
process stayed up, and with no handshake timeout the flood held its descriptors for ever.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from remote_gpu import tokens
from remote_gpu.client import RemoteGPU
from testbed.wait import wait_for

from .conftest import SECRET

ROOT = Path(__file__).resolve().parents[3]
NOFILE = 40  # the donor's descriptor limit: about 30 left for connections
FLOOD = 100  # fits the listen backlog (128): every one connects at once


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Donor:
    def __init__(self, tmp: Path, *flags: str) -> None:
        secret = tmp / "secret"
        secret.write_bytes(SECRET)
        self.port = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "composable_dra_cli", "--log-level", "info",
            "remote-gpu-donor", "--name", "flooded", "--secret-file", str(secret),
            "--listen", self.endpoint, "--transports", "tcp",
            "--allow", "echo=remote_gpu.builtins:echo", *flags,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        # Before it opens more than its first few descriptors (the limit binds new ones).
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.prlimit(self.proc.pid, resource.RLIMIT_NOFILE, (NOFILE, hard))
        self.events: list[dict[str, object]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.events.append(json.loads(line))

    def logged(self, event: str, **fields: object) -> bool:
        return any(
            e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
            for e in list(self.events)
        )

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(20)
        finally:
            self._reader.join(5)


@pytest.fixture
def donor(tmp_path: Path) -> Iterator[Donor]:
    running = Donor(
        tmp_path, "--handshake-timeout", "1", "--max-connections-per-peer", str(10 * FLOOD)
    )
    try:
        wait_for(lambda: running.logged("donor listening"), 30, "the donor to listen")
        yield running
    finally:
        assert running.stop() == 0, "SIGTERM should shut the donor down cleanly"


def _dropped(flood: list[socket.socket], deadline: float) -> int:
    """Read the flood's sockets until the donor has closed every one (or the deadline)."""
    open_ = list(flood)
    while open_ and time.monotonic() < deadline:
        readable, _, _ = select.select(open_, [], [], 0.5)
        for s in readable:
            try:
                closed = s.recv(4096) == b""
            except ConnectionResetError:
                closed = True
            except BlockingIOError:
                closed = False
            if closed:
                open_.remove(s)
    return len(flood) - len(open_)


def test_a_donor_flooded_past_its_descriptors_still_serves_a_good_client(donor: Donor) -> None:
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", donor.port))
            flood.append(s)
        # Each half-open connection is accepted in its turn and refused at once or dropped
        # after its handshake timeout: descriptors come back and accepting goes on.
        assert _dropped(flood, time.monotonic() + 90) == FLOOD
        assert donor.proc.poll() is None
    finally:
        for s in flood:
            s.close()
    tok = tokens.issue(SECRET, 1, "flooded", 60)
    with RemoteGPU(donor.endpoint, tok, transport="tcp", timeout=30) as gpu:
        assert gpu.invoke("echo", np.arange(5))[0].tolist() == [0, 1, 2, 3, 4]
    assert os.path.exists(f"/proc/{donor.proc.pid}")
