"""Benchmark of the remote GPU data plane, against ceilings nobody here wrote. The last
line printed is JSON; it exits non-zero when a goal is missed, and with 2 (before it
starts anything) when ``iperf3`` or ``sockperf`` is missing (``hack/bench/ceilings.py``).

1. Throughput of ``echo`` at 64 KiB, 1 MiB and 8 MiB over TCP and shared memory. Every
   client starts from an ordinary numpy array in its own memory. TCP sends it and
   receives the result into a new array. Shared memory copies it into the lease's arena,
   and the result comes back as a view of the arena (``shm``: the client's default, no
   copy back) or copied out of it (``shm_copies``: ``views=False``). Before measuring,
   every client echoes random bytes and the bench checks that they come back equal.
   Beside them, in the same rounds: the TCP ceiling, ``iperf3`` at the same write size
   (one stream, one way: an echo cannot beat it per direction; iperf3 takes writes of 1
   MiB at most, so 8 MiB has none); the shared-memory ceiling, a raw
   ping-pong through an arena of the same geometry with the same copies in and out and
   no protocol (``shm_pingpong.py``); memcpy; and the floor of Python itself, a bare
   Python socket echo at the same depth and socket options (``python_socket``: no
   frames, no MACs). Every connection is warmed up and kept; the measurements are
   interleaved in ``ROUNDS`` rounds (3), and each ratio is the median of the per-round
   ratios, so that the shared machine's drift hits both sides of a ratio alike.
2. Calls per second of sequential 4 KiB echoes over TCP against ``sockperf ping-pong
   --tcp`` with 4 KiB messages, by default and busy-polling, the better of the two
   (``calls_vs_ceiling_4kib``); beside them a bare Python socket ping-pong and the floor
   of an authenticated protocol in CPython (``framed_pingpong.py``), interleaved likewise.
3. Round-trip p50/p99 of small frames over TCP and shared memory (medians of 3 runs).
4. Unless ``--data-plane``: the feature-extraction experiment: a 66 ms stage, 0.92 MB
   frames, N = 1..8 workers (one lease each): unshaped, then inside a private network
   namespace whose loopback is shaped by ``tc tbf``, where admission control predicts
   the knee from the measured bandwidth and the knee is then measured.

Goals (issue 31, item 4): ``tcp_vs_ceiling_64kib`` and ``tcp_vs_ceiling_1mib`` >= 0.8,
``calls_vs_ceiling_4kib`` >= 0.8, ``shm_vs_pingpong_1mib`` >= 0.8, ``rtt_small_shm``
p50 <= 100 us; with the admission part, ``fps_4_workers`` >= 55 and the knee within one
worker. Figures from the development machine, and what bounds them: docs/architecture.md
(The remote-GPU fallback, "The data plane against its ceilings").
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hack.bench import placement  # noqa: E402
from hack.bench.ceilings import IPERF3_MAX_WRITE, Ceilings, MissingTool, Tool, require  # noqa: E402
from hack.bench.framed_pingpong import FramedPingPong  # noqa: E402
from hack.bench.goals import finish, goal  # noqa: E402
from hack.bench.shm_pingpong import PingPong  # noqa: E402
from hack.bench.stats import percentile  # noqa: E402
from remote_gpu import tokens  # noqa: E402
from remote_gpu.admission import measure_bandwidth  # noqa: E402
from remote_gpu.client import RemoteGPU  # noqa: E402
from remote_gpu.errors import AdmissionRefused  # noqa: E402
from remote_gpu.transports.tcp import tune  # noqa: E402
from testbed.process import donor_argv  # noqa: E402

SECRET = b"benchmark-secret-0123456789abcdef"
SIZES = {"64kib": 64 << 10, "1mib": 1 << 20, "8mib": 8 << 20}
SMALL = ("4kib", 4 << 10)  # the request/response rate's message size
CREDITS = 4
QUOTA = 72 << 20
FRAME_BYTES = 920_000
STAGE_S = 0.066
ROUNDS = int(os.environ.get("REMOTE_GPU_BENCH_ROUNDS", "3"))
_lease = iter(range(1, 1 << 30))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DonorProcess:
    def __init__(self, *extra: str) -> None:
        self.dir = tempfile.TemporaryDirectory()
        secret = Path(self.dir.name) / "secret"
        secret.write_bytes(SECRET)
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        cmd = donor_argv(
            "bench",
            secret,
            self.endpoint,
            "--memory-quota",
            str(QUOTA),
            "--credits",
            str(CREDITS),
            "--allow",
            "echo=remote_gpu.builtins:echo",
            "--allow",
            "fe=remote_gpu.builtins:feature_extract",
            "--allow",
            "sink=remote_gpu.builtins:sink",
            *extra,
        )
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, preexec_fn=placement.server_preexec()
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("donor did not start") from None
                time.sleep(0.05)

    def client(self, **kw: object) -> RemoteGPU:
        tok = tokens.issue(SECRET, next(_lease), "bench", 600)
        return RemoteGPU(self.endpoint, tok, **kw)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.dir.cleanup()


def pipelined(submit, n: int, depth: int) -> float:
    """Seconds to complete n requests keeping ``depth`` in flight."""
    start = time.perf_counter()
    window: list[Future[tuple[np.ndarray, ...]]] = []
    for _ in range(n):
        if len(window) >= depth:
            window.pop(0).result()
        window.append(submit())
    for f in window:
        f.result()
    return time.perf_counter() - start


def count_for(size: int) -> int:
    return max(8, min(400, int(0.25e9 / size)))


def gpu_rate(gpu: RemoteGPU, a: np.ndarray, function: str = "echo") -> float:
    n = count_for(a.nbytes)
    return n * a.nbytes / pipelined(lambda: gpu.submit(function, a), n, CREDITS)


def _raw_echo_server(listener: socket.socket, size: int) -> None:
    conn, _ = listener.accept()
    tune(conn)
    buf = memoryview(bytearray(size))
    with conn:
        while True:
            got = 0
            while got < size:
                n = conn.recv_into(buf[got:])
                if n == 0:
                    return
                got += n
            conn.sendall(buf)


class RawEcho:
    """Echo over a plain Python TCP socket, same depth and options: the floor of what
    Python itself costs (no frames, no MACs), not a ceiling (see ``ceilings``)."""

    def __init__(self, size: int) -> None:
        import multiprocessing as mp

        self.size = size
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.server = mp.get_context("fork").Process(target=_raw_echo_server, args=(listener, size))
        self.server.start()
        placement.place_server(self.server.pid or 0)
        self.sock = socket.create_connection(listener.getsockname())
        listener.close()
        tune(self.sock)
        self.data = bytes(size)
        self.back = memoryview(bytearray(size))
        self.rate(max(4, count_for(size) // 8))  # warm up

    def rate(self, n: int | None = None) -> float:
        n = count_for(self.size) if n is None else n
        size, c = self.size, self.sock
        sem = threading.Semaphore(CREDITS)

        def sender() -> None:
            for _ in range(n):
                sem.acquire()
                c.sendall(self.data)

        start = time.perf_counter()
        t = threading.Thread(target=sender)
        t.start()
        for _ in range(n):
            got = 0
            while got < size:
                got += c.recv_into(self.back[got:])
            sem.release()
        t.join()
        return n * size / (time.perf_counter() - start)

    def ping_pong(self, n: int) -> float:
        """Round trips per second, one in flight: a bare Python socket ping-pong."""
        size, c, back = self.size, self.sock, self.back
        start = time.perf_counter()
        for _ in range(n):
            c.sendall(self.data)
            got = 0
            while got < size:
                got += c.recv_into(back[got:])
        return n / (time.perf_counter() - start)

    def close(self) -> None:
        self.sock.close()
        self.server.join(10)


def memcpy_rate(size: int) -> float:
    a = np.ones(size, dtype=np.uint8)
    b = np.empty_like(a)
    n = count_for(size) * 4
    start = time.perf_counter()
    for _ in range(n):
        np.copyto(b, a)
    return n * size / (time.perf_counter() - start)


def check_round_trip(gpu: RemoteGPU, size: int) -> None:
    """The bytes really go there and back: echo of random data comes back equal."""
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    (back,) = gpu.invoke("echo", data)
    if back.shape != data.shape or not np.array_equal(back, data):
        raise RuntimeError(f"{gpu.transport} echo of {size} bytes came back different")


def _median_ratio(runs: dict[str, list[float]], x: str, y: str) -> float:
    """The median of the per-round ratios x/y: drift of the shared machine hits both."""
    return round(statistics.median(p / q for p, q in zip(runs[x], runs[y], strict=True)), 3)


def _measure(measure: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """``ROUNDS`` rounds of every measurement, interleaved."""
    runs: dict[str, list[float]] = {k: [] for k in measure}
    for _ in range(ROUNDS):
        for name, rate in measure.items():
            runs[name].append(rate())
    return runs


# The throughput ratios reported: name -> (measurement, the one it is divided by).
RATIOS = {
    "tcp_vs_ceiling": ("tcp_one_way", "iperf3"),  # like with like: bytes go one way
    "tcp_echo_vs_ceiling": ("tcp", "iperf3"),
    "python_socket_vs_ceiling": ("python_socket", "iperf3"),
    "tcp_vs_python_socket": ("tcp", "python_socket"),
    "shm_vs_tcp": ("shm", "tcp"),
    "shm_copies_vs_tcp": ("shm_copies", "tcp"),
    "shm_vs_pingpong": ("shm_copies", "pingpong"),  # the same copies in and out
    "shm_vs_memcpy": ("shm", "memcpy"),
}


def throughput(
    donor: DonorProcess, ceilings: Ceilings, pingpong: PingPong, label: str, size: int
) -> dict[str, float]:
    a = np.ones(size, dtype=np.uint8)
    raw = RawEcho(size)
    gpus = {
        "tcp": donor.client(transport="tcp", credits=CREDITS),
        "shm": donor.client(transport="shm", credits=CREDITS),
        "shm_copies": donor.client(transport="shm", credits=CREDITS, views=False),
    }
    n = count_for(size)
    measure: dict[str, Callable[[], float]] = {
        **({"iperf3": partial(ceilings.tcp_bytes_per_s, size)} if size <= IPERF3_MAX_WRITE else {}),
        "python_socket": raw.rate,
        **{name: partial(gpu_rate, gpu, a) for name, gpu in gpus.items()},
        "tcp_one_way": partial(gpu_rate, gpus["tcp"], a, "sink"),
        "pingpong": lambda: pingpong.rate(a, n, CREDITS),
        "memcpy": lambda: memcpy_rate(size),
    }
    try:
        for gpu in gpus.values():  # warm up
            check_round_trip(gpu, size)
            for _ in range(max(4, n // 8)):
                gpu.invoke("echo", a)
        pingpong.rate(a, max(4, n // 8), CREDITS)
        runs = _measure(measure)
    finally:
        for gpu in gpus.values():
            gpu.close()
        raw.close()
    out = {f"{k}_GBps_{label}": round(statistics.median(v) / 1e9, 3) for k, v in runs.items()}
    for name, (x, y) in RATIOS.items():
        if x in runs and y in runs:
            out[f"{name}_{label}"] = _median_ratio(runs, x, y)
    return out


def calls(donor: DonorProcess, ceilings: Ceilings, seconds: float = 1.0) -> dict[str, float]:
    """Sequential calls per second of ``SMALL`` echoes over TCP, interleaved in rounds
    with: sockperf's TCP ping-pong, as it runs by default and busy-polling (the ceiling
    of a round is the better of the two); a bare Python socket ping-pong; and the framed
    floor (``framed_pingpong``: what any authenticated protocol in CPython must do)."""
    label, size = SMALL
    a = np.ones(size, dtype=np.uint8)
    raw = RawEcho(size)
    framed = FramedPingPong(size)
    gpu = donor.client(transport="tcp")

    def tcp_rate() -> float:
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            gpu.invoke("echo", a)
            n += 1
        return n / elapsed

    try:
        check_round_trip(gpu, size)
        for _ in range(200):
            gpu.invoke("echo", a)
        raw.ping_pong(200)
        framed.round_trips_per_s(a, 200)
        runs = _measure(
            {
                "sockperf": lambda: ceilings.round_trips_per_s(size),
                "sockperf_busy_poll": lambda: ceilings.round_trips_per_s(size, busy=True),
                "python_socket": lambda: raw.ping_pong(2000),
                "python_framed": lambda: framed.round_trips_per_s(a, 4000),
                "tcp": tcp_rate,
            }
        )
    finally:
        gpu.close()
        raw.close()
        framed.close()
    default, busy = runs["sockperf"], runs["sockperf_busy_poll"]
    runs["ceiling"] = [max(p, q) for p, q in zip(default, busy, strict=True)]
    out: dict[str, float] = {
        f"{k}_calls_per_s_{label}": round(statistics.median(v)) for k, v in runs.items()
    }
    out[f"calls_vs_ceiling_{label}"] = _median_ratio(runs, "tcp", "ceiling")
    out[f"python_socket_vs_ceiling_{label}"] = _median_ratio(runs, "python_socket", "ceiling")
    out[f"python_framed_vs_ceiling_{label}"] = _median_ratio(runs, "python_framed", "ceiling")
    out[f"tcp_vs_python_framed_{label}"] = _median_ratio(runs, "tcp", "python_framed")
    return out


def round_trips(donor: DonorProcess, transport: str, n: int = 2000) -> dict[str, float]:
    """p50 and p99 of small echoes, one in flight: the medians over ``ROUNDS`` runs."""
    a = np.arange(16, dtype=np.float32)
    p50s, p99s = [], []
    with donor.client(transport=transport) as gpu:
        for _ in range(50):
            gpu.invoke("echo", a)
        for _ in range(ROUNDS):
            samples = []
            for _ in range(n):
                t0 = time.perf_counter()
                gpu.invoke("echo", a)
                samples.append(time.perf_counter() - t0)
            p50s.append(percentile(samples, 0.5))
            p99s.append(percentile(samples, 0.99))
    return {
        "p50_us": round(statistics.median(p50s) * 1e6, 1),
        "p99_us": round(statistics.median(p99s) * 1e6, 1),
    }


def fps(donor: DonorProcess, workers: int, seconds: float = 1.5) -> float:
    frame = np.ones(FRAME_BYTES, dtype=np.uint8)
    gpus = [donor.client(transport="tcp", credits=2) for _ in range(workers)]
    done = [0] * workers
    stop = threading.Event()

    def loop(i: int) -> None:
        window: list[Future[tuple[np.ndarray, ...]]] = []
        while not stop.is_set():
            if len(window) >= 2:
                window.pop(0).result()
                done[i] += 1
            window.append(gpus[i].submit("fe", frame))
        for f in window:
            f.result()

    for g in gpus:
        g.invoke("fe", frame)
    threads = [threading.Thread(target=loop, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # warm up the pipelines before counting
    base = sum(done)
    t0 = time.perf_counter()
    time.sleep(seconds)
    frames = sum(done) - base
    elapsed = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    for g in gpus:
        g.close()
    return frames / elapsed


def fps_sweep(donor: DonorProcess, max_workers: int = 8) -> dict[int, float]:
    return {n: round(fps(donor, n), 2) for n in range(1, max_workers + 1)}


def knee(curve: dict[int, float]) -> int:
    """The most workers for which throughput still scales (>= 90% of linear)."""
    single = curve[1]
    best = 1
    for n, f in curve.items():
        if f >= 0.9 * n * single:
            best = n
    return best


def shaped_part(rate_mbit: int) -> dict[str, object]:
    """Runs inside a private network namespace: shape lo, predict and measure the knee."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(
        [
            "tc",
            "qdisc",
            "add",
            "dev",
            "lo",
            "root",
            "tbf",
            "rate",
            f"{rate_mbit}mbit",
            "burst",
            "256kb",
            "latency",
            "100ms",
        ],
        check=True,
    )
    bandwidth = measure_bandwidth("127.0.0.1", seconds=1.5)
    demand = FRAME_BYTES / STAGE_S
    limited = DonorProcess("--link-bandwidth", str(bandwidth), "--headroom", "1.0")
    admitted: list[RemoteGPU] = []
    try:
        while len(admitted) < 32:
            admitted.append(
                limited.client(transport="tcp", frame_bytes=FRAME_BYTES, target_rate=1 / STAGE_S)
            )
    except AdmissionRefused:
        pass
    for g in admitted:
        g.close()
    limited.stop()
    donor = DonorProcess()
    try:
        curve = fps_sweep(donor)
    finally:
        donor.stop()
    return {
        "tbf_rate_mbit": rate_mbit,
        "measured_bandwidth_MBps": round(bandwidth / 1e6, 2),
        "demand_per_worker_MBps": round(demand / 1e6, 2),
        "fps_knee_predicted": len(admitted),
        "fps_knee_workers": knee(curve),
        "fps_shaped": curve,
    }


def data_plane(donor: DonorProcess, tools: dict[str, Tool]) -> dict[str, object]:
    """Throughput, call rate and round trips, each with its ceiling measured beside it."""
    out: dict[str, object] = {
        "rounds": ROUNDS,
        "ceiling_tools": {t.name: t.describe() for t in tools.values()},
    }
    ceilings = Ceilings(tools)
    pingpong = PingPong(QUOTA, CREDITS)
    try:
        for label, size in SIZES.items():
            out.update(throughput(donor, ceilings, pingpong, label, size))
        out.update(calls(donor, ceilings))
    finally:
        pingpong.close()
        ceilings.close()
    out["rtt_small_tcp"] = round_trips(donor, "tcp")
    out["rtt_small_shm"] = round_trips(donor, "shm")
    return out


def admission(donor: DonorProcess) -> dict[str, object]:
    """The feature-extraction sweep unshaped, then shaped in a private network namespace."""
    curve = fps_sweep(donor)
    out: dict[str, object] = {"fps_unshaped": curve, "fps_4_workers": curve[4]}
    rate = int(os.environ.get("REMOTE_GPU_BENCH_TBF_MBIT", "360"))
    shaped = subprocess.run(
        ["unshare", "-rn", sys.executable, __file__, "--shaped", str(rate)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if shaped.returncode == 0:
        out.update(json.loads(shaped.stdout.strip().splitlines()[-1]))
    else:
        out["shaped_error"] = shaped.stderr.strip().splitlines()[-1:]
    return out


def goals(out: dict[str, object], with_admission: bool) -> dict[str, dict[str, object]]:
    """Item 4's goals against the measured ceilings, and (the full run) admission's."""
    rtt = out.get("rtt_small_shm")
    found = {
        "tcp_vs_ceiling_64kib": goal(_num(out.get("tcp_vs_ceiling_64kib")), floor=0.8),
        "tcp_vs_ceiling_1mib": goal(_num(out.get("tcp_vs_ceiling_1mib")), floor=0.8),
        "calls_vs_ceiling_4kib": goal(_num(out.get("calls_vs_ceiling_4kib")), floor=0.8),
        "shm_vs_pingpong_1mib": goal(_num(out.get("shm_vs_pingpong_1mib")), floor=0.8),
        "rtt_small_shm": goal(
            _num(rtt.get("p50_us")) if isinstance(rtt, dict) else None, ceiling=100
        ),
    }
    if with_admission:
        knee_p, knee_m = out.get("fps_knee_predicted"), out.get("fps_knee_workers")
        found["fps_4_workers"] = goal(_num(out.get("fps_4_workers")), floor=55)
        # How far admission control's predicted knee is from the measured one, in workers.
        found["knee_error_workers"] = goal(
            abs(knee_p - knee_m) if isinstance(knee_p, int) and isinstance(knee_m, int) else None,
            ceiling=1,
        )
    return found


def main(argv: list[str] | None = None) -> int:
    from composable_dra.process import logs

    parser = argparse.ArgumentParser(description="The remote GPU data plane's benchmark.")
    parser.add_argument("--data-plane", action="store_true", help="skip the admission sweeps")
    parser.add_argument("--shaped", type=int, metavar="MBIT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logs.configure("bench", "warning", "json")
    if args.shaped is not None:
        print(json.dumps(shaped_part(args.shaped)))
        return 0
    try:
        tools = require()  # before anything starts
    except MissingTool as exc:
        print(f"remote_gpu bench: {exc}", file=sys.stderr)
        print(json.dumps({"error": str(exc), "goals_met": False}), flush=True)
        return 2
    cpus = os.sched_getaffinity(0)
    where = placement.split()  # clients on one CPU, servers on another (placement.py)
    try:
        donor = DonorProcess()
        try:
            out = data_plane(donor, tools)
        finally:
            donor.stop()
    finally:
        placement.release(cpus)
    out["placement"] = (
        {"clients_cpu": min(where[0]), "servers_cpu": min(where[1])} if where else "one CPU"
    )
    if not args.data_plane:
        donor = DonorProcess()  # the admission sweeps run where the scheduler puts them
        try:
            out.update(admission(donor))
        finally:
            donor.stop()
    return finish(out, goals(out, with_admission=not args.data_plane))


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


if __name__ == "__main__":
    raise SystemExit(main())
