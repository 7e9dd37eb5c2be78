"""Where the data-plane bench's two ends run: every client on one CPU, every server (the
donor and its workers, iperf3's and sockperf's servers, the ping-pong peers) on another.

Left to the scheduler, the same ping-pong ran at 19 or at 97 us a round trip on the
development machine (two vCPUs), depending on whether both ends happened to share a CPU
(a wake-up between the vCPUs of a virtual machine costs tens of microseconds), and a
spinning end that shared its CPU with the other halved a transfer's rate. Pinned, each
measurement and its ceiling run in the same placement, and rounds repeat. On a machine
with one CPU nothing is pinned.

A library of ``hack/bench/remote_gpu.py``, not a benchmark of its own: that bench prints
the goals, ends with its JSON and exits non-zero when a goal is missed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

_server: set[int] | None = None


def split() -> tuple[set[int], set[int]] | None:
    """Pin this process (and so every client it starts) to its first CPU and choose its
    second for servers; None, pinning nothing, where it may use only one."""
    global _server
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    client, _server = {cpus[0]}, {cpus[1]}
    os.sched_setaffinity(0, client)
    return client, _server


def release(cpus: set[int]) -> None:
    """Let this process (and what it starts from now on) run on ``cpus`` again."""
    global _server
    _server = None
    os.sched_setaffinity(0, cpus)


def place_server(pid: int) -> None:
    """Move a server process already started (a forked peer) to the servers' CPU."""
    if _server is not None:
        os.sched_setaffinity(pid, _server)


def server_preexec() -> Callable[[], None] | None:
    """For ``subprocess.Popen(preexec_fn=...)``: the server starts on the servers' CPU
    (before it starts any process of its own: a donor's workers stay there too)."""
    cpus = _server
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)
