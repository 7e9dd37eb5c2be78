"""Benchmark of the remote GPU data plane. The last line printed is JSON.

1. Throughput of ``echo`` at 64 KiB, 1 MiB and 8 MiB over TCP and shared memory, with the
   raw-socket and memcpy ceilings measured in the same run. Every client starts from an
   ordinary numpy array in its own memory. TCP sends it and receives the result into a
   new array. Shared memory copies it into the lease's arena, and the result comes back
   as a view of the arena (``shm``: the client's default, no copy back) or copied out of
   it (``shm_copies``: ``views=False``). Before measuring, every client echoes random
   bytes and the bench checks that they come back equal. The raw socket echoes the same
   sizes at the same in-flight depth with the same socket options; every connection is
   warmed up and kept; the measurements are interleaved in rounds (raw, tcp, shm, shm
   copies, memcpy), and the ratios are medians of the per-round ratios, so that the
   shared machine's drift hits both sides of a ratio alike.
2. Round-trip p50/p99 of small frames.
3. The feature-extraction experiment: a 66 ms stage, 0.92 MB frames, N = 1..8 workers
   (one lease each): unshaped, then inside a private network namespace whose loopback is
   shaped by ``tc tbf``, where admission control predicts the knee from the measured
   bandwidth and the knee is then measured.
All figures are medians of repeated runs.

One run on the development machine (2 vCPUs shared with other work, 7 rounds), at 1 MiB:
TCP 1.82 GB/s (0.88 of the raw socket's 2.00), shared memory 9.86 GB/s (5.8 times TCP),
shared memory with results copied out 4.33 GB/s (2.7 times), memcpy 23.4 GB/s. Before
the shared-memory fast path, on the same machine: TCP 1.47, shared memory (copies) 3.54
(2.6 times), with views 6.45 (4.5 times). What bounds shared memory at 1 MiB: a call costs
the client about 95 us on a quiet machine, of which about 62 us copy the argument into a
slot that is no longer in the cache (16-17 GB/s, where memcpy between cache-resident
buffers reaches 24) and about 33 us are Python (submit, parsing and checking the reply's
MACed frames, the future; 22-23 us a call at 64 bytes, where they were 55-60). The
worker is off the critical path (about 20 us a call, on the other CPU). A shared-memory
round lasts about 25 ms, so a single preemption by another task shows in it: the 1 MiB
ratio ranged from 5.2 to 5.8 over runs on a quiet machine.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hack.bench.goals import finish, goal  # noqa: E402
from hack.bench.stats import percentile  # noqa: E402
from remote_gpu import tokens  # noqa: E402
from remote_gpu.admission import measure_bandwidth  # noqa: E402
from remote_gpu.client import RemoteGPU  # noqa: E402
from remote_gpu.errors import AdmissionRefused  # noqa: E402
from remote_gpu.transports.tcp import tune  # noqa: E402
from testbed.process import donor_argv  # noqa: E402

SECRET = b"benchmark-secret-0123456789abcdef"
SIZES = {"64kib": 64 << 10, "1mib": 1 << 20, "8mib": 8 << 20}
CREDITS = 4
FRAME_BYTES = 920_000
STAGE_S = 0.066
REPS = 3
ROUNDS = int(os.environ.get("REMOTE_GPU_BENCH_ROUNDS", "7"))
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
            str(72 << 20),
            "--credits",
            str(CREDITS),
            "--allow",
            "echo=remote_gpu.builtins:echo",
            "--allow",
            "fe=remote_gpu.builtins:feature_extract",
            *extra,
        )
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
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


def gpu_rate(gpu: RemoteGPU, a: np.ndarray) -> float:
    n = count_for(a.nbytes)
    return n * a.nbytes / pipelined(lambda: gpu.submit("echo", a), n, CREDITS)


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
    """Echo over a plain TCP socket, same depth and options: the socket ceiling."""

    def __init__(self, size: int) -> None:
        import multiprocessing as mp

        self.size = size
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.server = mp.get_context("fork").Process(target=_raw_echo_server, args=(listener, size))
        self.server.start()
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


def throughput(donor: DonorProcess, label: str, size: int) -> dict[str, float]:
    a = np.ones(size, dtype=np.uint8)
    raw = RawEcho(size)
    gpus = {
        "tcp": donor.client(transport="tcp", credits=CREDITS),
        "shm": donor.client(transport="shm", credits=CREDITS),
        "shm_copies": donor.client(transport="shm", credits=CREDITS, views=False),
    }
    runs: dict[str, list[float]] = {k: [] for k in ("raw", *gpus, "memcpy")}
    try:
        for gpu in gpus.values():  # warm up
            check_round_trip(gpu, size)
            for _ in range(max(4, count_for(size) // 8)):
                gpu.invoke("echo", a)
        for _ in range(ROUNDS):
            runs["raw"].append(raw.rate())
            for name, gpu in gpus.items():
                runs[name].append(gpu_rate(gpu, a))
            runs["memcpy"].append(memcpy_rate(size))
    finally:
        for gpu in gpus.values():
            gpu.close()
        raw.close()

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    def ratio(x: str, y: str) -> float:
        return round(med([p / q for p, q in zip(runs[x], runs[y], strict=True)]), 3)

    return {
        f"tcp_GBps_{label}": round(med(runs["tcp"]) / 1e9, 3),
        f"raw_socket_GBps_{label}": round(med(runs["raw"]) / 1e9, 3),
        f"shm_GBps_{label}": round(med(runs["shm"]) / 1e9, 3),
        f"shm_copies_GBps_{label}": round(med(runs["shm_copies"]) / 1e9, 3),
        f"memcpy_GBps_{label}": round(med(runs["memcpy"]) / 1e9, 3),
        f"tcp_vs_raw_{label}": ratio("tcp", "raw"),
        f"shm_vs_tcp_{label}": ratio("shm", "tcp"),
        f"shm_copies_vs_tcp_{label}": ratio("shm_copies", "tcp"),
        f"shm_vs_memcpy_{label}": ratio("shm", "memcpy"),
    }


def round_trips(donor: DonorProcess, transport: str, n: int = 2000) -> dict[str, float]:
    a = np.arange(16, dtype=np.float32)
    with donor.client(transport=transport) as gpu:
        for _ in range(50):
            gpu.invoke("echo", a)
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            gpu.invoke("echo", a)
            samples.append(time.perf_counter() - t0)
    return {
        "p50_us": round(percentile(samples, 0.5) * 1e6, 1),
        "p99_us": round(percentile(samples, 0.99) * 1e6, 1),
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


def main() -> int:
    from composable_dra.process import logs

    logs.configure("bench", "warning", "json")
    if len(sys.argv) > 2 and sys.argv[1] == "--shaped":
        print(json.dumps(shaped_part(int(sys.argv[2]))))
        return 0
    out: dict[str, object] = {}
    donor = DonorProcess()
    try:
        out["rounds"] = ROUNDS
        for label, size in SIZES.items():
            out.update(throughput(donor, label, size))
        out["rtt_small_tcp"] = round_trips(donor, "tcp")
        out["rtt_small_shm"] = round_trips(donor, "shm")
        curve = fps_sweep(donor)
        out["fps_unshaped"] = curve
        out["fps_4_workers"] = curve[4]
    finally:
        donor.stop()
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
    knee_p, knee_m = out.get("fps_knee_predicted"), out.get("fps_knee_workers")
    goals = {
        "tcp_vs_raw_1mib": goal(_num(out.get("tcp_vs_raw_1mib")), floor=0.8),
        "shm_vs_tcp_1mib": goal(_num(out.get("shm_vs_tcp_1mib")), floor=5),
        "fps_4_workers": goal(_num(out.get("fps_4_workers")), floor=55),
        # How far admission control's predicted knee is from the measured one, in workers.
        "knee_error_workers": goal(
            abs(knee_p - knee_m) if isinstance(knee_p, int) and isinstance(knee_m, int) else None,
            ceiling=1,
        ),
    }
    return finish(out, goals)


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


if __name__ == "__main__":
    raise SystemExit(main())
