"""Loopback ceilings for the remote GPU data plane, from tools nobody here wrote.

- ``iperf3``: loopback TCP throughput at a given write size, one stream, one way. An echo
  moves its bytes both ways, so this is a ceiling it cannot beat per direction (``iperf3
  --bidir``, single-threaded in bookworm's 3.12, was beaten 2.7-3.2 times by a bare
  Python socket echo on the development machine: no ceiling).
- ``sockperf ping-pong --tcp``: round trips per second of a message of a given size, one
  in flight (the server sends each message back), as sequential calls make them. Twice:
  as it runs by default (it sleeps in ``epoll_wait`` between messages) and busy-polling
  (``--nonblocked --timeout 0`` on both ends: it never sleeps), since the TCP transport
  looks without sleeping for a while before it sleeps. Which of the two is faster depends
  on where the scheduler puts the two ends (a wake-up between the vCPUs of a virtual
  machine costs tens of microseconds); the ceiling is the better of the two.

Both run as subprocesses against their own server on 127.0.0.1 (Debian bookworm packages
``iperf3`` and ``sockperf``). A missing tool is :class:`MissingTool`, raised before
anything starts. The parsers read the tools' own output (not the network).

A library of ``hack/bench/remote_gpu.py``, not a benchmark of its own: that bench prints
the goals, ends with its JSON and exits non-zero when a goal is missed.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from hack.bench import placement
from testbed.wait import wait_for

TOOLS = ("iperf3", "sockperf")
IPERF3_MAX_WRITE = 1 << 20  # iperf3 refuses larger blocks
# sockperf busy-polling: non-blocking sockets, epoll_wait that never sleeps.
BUSY_POLL = ("--nonblocked", "--timeout", "0")
INSTALL = "apt-get install -y iperf3 sockperf"


class MissingTool(RuntimeError):
    """A ceiling's tool is not on PATH."""


@dataclass(frozen=True)
class Tool:
    name: str
    version: str
    path: str

    def describe(self) -> str:
        return f"{self.name} {self.version}"


def require(names: Sequence[str] = TOOLS) -> dict[str, Tool]:
    """Every tool of ``names`` with its version; :class:`MissingTool` names those missing."""
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        raise MissingTool(
            f"{', '.join(missing)} not found on PATH: the bench takes its ceilings from "
            f"them (Debian bookworm: {INSTALL})"
        )
    tools: dict[str, Tool] = {}
    for name in names:
        path = shutil.which(name)
        assert path is not None
        text = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
        tools[name] = Tool(name, parse_version(name, text.stdout + text.stderr), path)
    return tools


_VERSIONS = {
    "iperf3": re.compile(r"iperf (\d+\.\d+\S*)"),
    "sockperf": re.compile(r"sockperf,? version #?\s*(\d+\.\d+\S*)"),
}


def parse_version(name: str, text: str) -> str:
    """The version ``name --version`` printed; ValueError if there is none."""
    m = _VERSIONS[name].search(text)
    if m is None:
        raise ValueError(f"no version in what {name} --version printed: {text[:200]!r}")
    return m.group(1)


def parse_iperf3(report: str) -> float:
    """Bytes per second received in an ``iperf3 -J`` report; ValueError for a report of a
    failed run or without the receiver's sum."""
    data = json.loads(report)
    if not isinstance(data, dict) or data.get("error"):
        raise ValueError(f"iperf3 failed: {data.get('error') if isinstance(data, dict) else data}")
    end = data.get("end", {})
    try:
        bits = float(end["sum_received"]["bits_per_second"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("iperf3 report lacks the receiver's sum") from None
    return bits / 8


_VALID = re.compile(
    r"\[Valid Duration\] RunTime=([\d.]+) sec; SentMessages=(\d+); ReceivedMessages=(\d+)"
)


def parse_sockperf(text: str) -> float:
    """Round trips per second of a ``sockperf ping-pong`` run: the messages received back
    in its valid duration (after warm-up) over that duration."""
    m = _VALID.search(text)
    if m is None:
        raise ValueError("sockperf printed no [Valid Duration] line")
    seconds, received = float(m.group(1)), int(m.group(3))
    if seconds <= 0 or received <= 0:
        raise ValueError(f"sockperf measured {received} messages in {seconds} s")
    return received / seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class ToolServer:
    """A tool's server on 127.0.0.1, listening once constructed; ``close`` stops it."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.port = _free_port()
        cmd = [a.format(port=self.port) for a in argv]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=placement.server_preexec(),
        )
        try:
            wait_for(
                lambda: self.proc.poll() is not None or _accepts(self.port),
                10,
                f"{cmd[0]} server listening",
                interval=0.02,
            )
            if self.proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} server exited with {self.proc.returncode}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _run(cmd: list[str], seconds: float) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited with {done.returncode}: {done.stderr[-300:]}")
    return done.stdout + done.stderr


class Ceilings:
    """The tools' servers, kept for the bench's lifetime; one measurement per call."""

    def __init__(self, tools: dict[str, Tool], seconds: int = 1) -> None:
        self.tools = tools
        self.seconds = seconds
        self.iperf3 = ToolServer([tools["iperf3"].path, "-s", "-B", "127.0.0.1", "-p", "{port}"])
        try:
            self.sockperf = self._sockperf_server()
        except BaseException:
            self.iperf3.close()
            raise

    def tcp_bytes_per_s(self, size: int) -> float:
        """iperf3's loopback rate, one stream one way, writes of ``size``."""
        cmd = [self.tools["iperf3"].path, "-c", "127.0.0.1", "-p", str(self.iperf3.port)]
        cmd += ["-l", str(size), "-t", str(self.seconds), "-J"]
        return parse_iperf3(_run(cmd, self.seconds))

    def round_trips_per_s(self, size: int, busy: bool = False) -> float:
        """sockperf's TCP ping-pong rate of ``size``-byte messages over loopback; ``busy``:
        both ends busy-polling, against a server started for this measurement only (it
        takes a CPU all the while)."""
        path = self.tools["sockperf"].path
        server = self._sockperf_server(*BUSY_POLL) if busy else self.sockperf
        try:
            cmd = [path, "ping-pong", "--tcp", "-i", "127.0.0.1", "-p", str(server.port)]
            cmd += ["-m", str(size), "-t", str(self.seconds), *(BUSY_POLL if busy else ())]
            return parse_sockperf(_run(cmd, self.seconds))
        finally:
            if busy:
                server.close()

    def _sockperf_server(self, *extra: str) -> ToolServer:
        path = self.tools["sockperf"].path
        return ToolServer([path, "server", "--tcp", "-i", "127.0.0.1", "-p", "{port}", *extra])

    def close(self) -> None:
        self.iperf3.close()
        self.sockperf.close()
