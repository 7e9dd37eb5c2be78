"""The data-plane bench (hack/bench/remote_gpu.py): its refusal without the ceiling tools,
the parsers of the tools' output, its goals, and the raw shared-memory ping-pong."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hack.bench import ceilings, placement
from hack.bench.ceilings import (
    BUSY_POLL,
    Ceilings,
    MissingTool,
    Tool,
    parse_iperf3,
    parse_sockperf,
    parse_version,
    require,
)
from hack.bench.framed_pingpong import FramedPingPong
from hack.bench.goals import all_met
from hack.bench.remote_gpu import goals
from hack.bench.shm_pingpong import PingPong
from remote_gpu.builtins import sink
from testbed.wait import wait_for

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "hack" / "bench" / "remote_gpu.py"


def test_without_the_ceiling_tools_the_bench_refuses_at_once(tmp_path: Path) -> None:
    # PATH holds neither iperf3 nor sockperf (nor a donor: nothing may start first).
    env = {**os.environ, "PATH": str(tmp_path)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(BENCH), "--data-plane"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "iperf3, sockperf not found on PATH" in done.stderr
    assert "apt-get install -y iperf3 sockperf" in done.stderr
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert last["goals_met"] is False and "iperf3" in last["error"]
    assert time.monotonic() - start < 30


def test_require_names_only_the_missing_tool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "iperf3"
    fake.write_text("#!/bin/sh\necho 'iperf 3.12 (cJSON 1.7.15)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(MissingTool, match=r"^sockperf not found"):
        require()
    assert require(("iperf3",))["iperf3"].describe() == "iperf3 3.12"


def test_versions_as_the_tools_print_them() -> None:
    assert parse_version("iperf3", "iperf 3.12 (cJSON 1.7.15)\nLinux vm ...") == "3.12"
    assert parse_version("sockperf", "sockperf, version 3.7-no.git\n   compiled") == "3.7-no.git"
    with pytest.raises(ValueError, match="no version"):
        parse_version("sockperf", "command not found")


def _iperf3(**end: Any) -> str:
    return json.dumps({"start": {"version": "iperf 3.12"}, "end": end})


def test_iperf3_ceiling_is_the_rate_received() -> None:
    report = _iperf3(sum_sent={"bits_per_second": 9e9}, sum_received={"bits_per_second": 8e9})
    assert parse_iperf3(report) == pytest.approx(1e9)  # bytes/s, as the receiver counted
    with pytest.raises(ValueError, match="receiver's sum"):
        parse_iperf3(_iperf3(sum_sent={"bits_per_second": 8e9}))
    with pytest.raises(ValueError, match="iperf3 failed: unable to connect"):
        parse_iperf3(json.dumps({"error": "unable to connect to server"}))


SOCKPERF = """\
sockperf: [Total Run] RunTime=2.000 sec; Warm up time=400 msec; SentMessages=56991; \
ReceivedMessages=56990
sockperf: ========= Printing statistics for Server No: 0
sockperf: [Valid Duration] RunTime=1.552 sec; SentMessages=46225; ReceivedMessages=46225
sockperf: Summary: Latency is 16.772 usec
"""


def test_sockperf_ceiling_counts_the_valid_duration_only() -> None:
    assert parse_sockperf(SOCKPERF) == pytest.approx(46225 / 1.552)
    with pytest.raises(ValueError, match="no \\[Valid Duration\\]"):
        parse_sockperf("sockperf: Test ended\n")
    with pytest.raises(ValueError, match="measured 0 messages"):
        parse_sockperf(SOCKPERF.replace("ReceivedMessages=46225", "ReceivedMessages=0"))


def figures(**over: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "tcp_vs_ceiling_64kib": 0.85,
        "tcp_vs_ceiling_1mib": 0.9,
        "calls_vs_ceiling_4kib": 0.81,
        "shm_vs_pingpong_1mib": 0.95,
        "rtt_small_shm": {"p50_us": 60.0, "p99_us": 300.0},
    }
    return {**out, **over}


def test_goals_of_the_data_plane() -> None:
    assert all_met(goals(figures(), with_admission=False))
    for missed in (
        {"tcp_vs_ceiling_64kib": 0.79},
        {"tcp_vs_ceiling_1mib": None},
        {"calls_vs_ceiling_4kib": 0.2},
        {"shm_vs_pingpong_1mib": 0.5},
        {"rtt_small_shm": {"p50_us": 100.1}},
        {"rtt_small_shm": None},
    ):
        assert not all_met(goals(figures(**missed), with_admission=False)), missed
    assert goals(figures(), with_admission=False)["rtt_small_shm"] == {
        "value": 60.0,
        "ceiling": 100,
        "met": True,
    }


def test_the_full_run_adds_the_admission_goals() -> None:
    full = figures(fps_4_workers=58.0, fps_knee_predicted=5, fps_knee_workers=6)
    assert all_met(goals(full, with_admission=True))
    assert not all_met(goals({**full, "fps_knee_workers": 7}, with_admission=True))
    assert not all_met(goals(figures(), with_admission=True))  # not measured


def test_shm_pingpong_moves_the_bytes_there_and_back() -> None:
    pp = PingPong(4 << 20, 4)
    try:
        data = np.random.default_rng(7).integers(0, 256, 64 << 10, dtype=np.uint8)
        assert pp.rate(data, 50, 4) > 0
        assert np.array_equal(pp.last, data)
        assert pp.rate(data[: 4 << 10], 10, 1) > 0  # one in flight
        assert np.array_equal(pp.last, data[: 4 << 10])
        with pytest.raises(ValueError, match="no fit"):
            pp.rate(data, 1, 5)  # more in flight than slots
    finally:
        pp.close()
    assert not pp.arena.path.exists()


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # exited; its new parent has yet to reap it


def test_the_pingpong_peer_stops_when_the_bench_dies_without_closing() -> None:
    script = (
        "import os, sys; sys.path.insert(0, sys.argv[1])\n"
        "from hack.bench.shm_pingpong import PingPong\n"
        "pp = PingPong(1 << 20, 2)\n"
        "print(pp._proc.pid, pp.arena.path, flush=True)\n"
        "os._exit(0)\n"
    )
    # The peer inherits stdout: read the one line, not up to EOF (which it would hold).
    bench = subprocess.Popen(
        [sys.executable, "-c", script, str(ROOT)], stdout=subprocess.PIPE, text=True
    )
    assert bench.stdout is not None
    with bench.stdout:
        pid_text, arena_text = bench.stdout.readline().split()
    assert bench.wait(30) == 0
    pid, arena = int(pid_text), Path(arena_text)
    try:
        wait_for(lambda: _gone(pid), 30, "the orphaned ping-pong peer to exit", 0.05)
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)  # leave no spinner behind, even on failure
        for path in (arena, *arena.parent.glob(arena.name + ".*")):
            path.unlink(missing_ok=True)


def test_sockperf_busy_polls_at_both_ends_against_a_server_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers: list[list[str]] = []
    closed: list[list[str]] = []

    class Server:
        port = 5001

        def __init__(self, argv: list[str]) -> None:
            self.argv = argv
            servers.append(argv)

        def close(self) -> None:
            closed.append(self.argv)

    ran: list[list[str]] = []

    def run(cmd: list[str], _seconds: float) -> str:
        ran.append(cmd)
        return SOCKPERF

    monkeypatch.setattr(ceilings, "ToolServer", Server)
    monkeypatch.setattr(ceilings, "_run", run)
    tools = {n: Tool(n, "1", f"/usr/bin/{n}") for n in ("iperf3", "sockperf")}
    c = Ceilings(tools)
    assert len(servers) == 2 and not any(set(BUSY_POLL) <= set(a) for a in servers)
    assert c.round_trips_per_s(4096) == pytest.approx(46225 / 1.552)
    assert not set(BUSY_POLL) & set(ran[-1][3:])  # by default, as it runs by default
    c.round_trips_per_s(4096, busy=True)
    busy_server = servers[-1]
    assert len(servers) == 3 and "server" in busy_server and set(BUSY_POLL) <= set(busy_server)
    assert set(BUSY_POLL) <= set(ran[-1]) and "ping-pong" in ran[-1]
    assert closed == [busy_server]  # a spinning server does not outlive its measurement


def test_the_framed_floor_checks_its_frames_and_moves_the_bytes() -> None:
    floor = FramedPingPong(4096)
    try:
        data = np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8)
        assert np.array_equal(floor.call(data), data)
        assert floor.round_trips_per_s(data, 100) > 0
    finally:
        floor.close()
    assert not floor._proc.is_alive()


def test_sink_returns_the_bytes_it_took() -> None:
    out = sink(np.ones(1000, np.uint8), np.ones(3, np.float64))
    assert out.dtype == np.int64 and out.tolist() == [1024]


def test_placement_puts_clients_and_servers_on_two_cpus() -> None:
    cpus = os.sched_getaffinity(0)
    where = placement.split()
    try:
        if len(cpus) < 2:
            assert where is None and placement.server_preexec() is None
            return
        assert where is not None
        client, server = where
        assert client.isdisjoint(server) and os.sched_getaffinity(0) == client
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"],
            stdin=subprocess.PIPE,
            preexec_fn=placement.server_preexec(),
        )
        try:
            assert os.sched_getaffinity(proc.pid) == server
        finally:
            proc.communicate(b"")
        pp = PingPong(1 << 20, 1)  # a forked peer moves to the servers' CPU too
        try:
            assert os.sched_getaffinity(pp._proc.pid or 0) == server
        finally:
            pp.close()
    finally:
        placement.release(cpus)
    assert os.sched_getaffinity(0) == cpus and placement.server_preexec() is None
