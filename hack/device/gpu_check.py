"""The remote GPU's GPU path on a GPU: what ``hack/device/gpu-check.sh`` runs once the
packages are in place. The last line printed is JSON.

For each backend (``cupy``, then ``torch``; ``--backends`` to choose) it starts a donor
with ``--backend <it>`` (a donor without that GPU refuses to start: reported, not hidden)
and, against it over TCP:

- the matmul workload (``remote_gpu.workloads.matmul``, its own process, with the env a
  claim's CDI spec gives): ``products_correct`` is its ``ok``;
- a 4096 x 4096 float32 product through the donor, and the same with numpy here:
  ``speedup_remote_4096`` (numpy's time over the call's, copies and network included) and
  ``remote_bytes_per_s_4096`` (the call's payload both ways over its time);
- in this process, the backend itself: ``speedup_backend_4096`` (numpy over the GPU
  kernel with its copies to and from the device), ``speedup_resident_4096`` (over the
  kernel alone, its operands already on the device) and ``h2d_bytes_per_s`` (a 256 MiB
  host array copied to the device, synchronised).

Each time is the median of ``--reps`` after one warm-up. Exit 0 when every backend ran and
every product was right, 1 otherwise. ``--backends numpy --size 256`` runs the same
plumbing without a GPU (no backend figures): what the unit test does.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from remote_gpu import backends, builtins, tokens  # noqa: E402
from remote_gpu.client import RemoteGPU  # noqa: E402

H2D_BYTES = 256 << 20
DONOR = "gpu-check"


def median_time(
    fn: Callable[[], object], reps: int, sync: Callable[[], None] = lambda: None
) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_donor(
    backend: str, secret: Path, port: int, log: Path
) -> tuple[subprocess.Popen[bytes], bool]:
    """The donor once it listens (True) or has exited (False): its output is copied to
    ``log`` by a thread, which also says when it listens (no polling; the pipe never
    fills)."""
    argv = [
        sys.executable, "-m", "composable_dra_cli", "--log-level", "info",
        "remote-gpu-donor", "--name", DONOR, "--secret-file", str(secret),
        "--listen", f"127.0.0.1:{port}", "--transports", "tcp", "--backend", backend,
        "--allow", "matmul=remote_gpu.builtins:matmul", "--memory-quota", str(1 << 30),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    ready, listening = threading.Event(), threading.Event()

    def copy() -> None:
        assert proc.stdout is not None
        with log.open("wb") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                if b"donor listening" in line:
                    listening.set()
                    ready.set()
        ready.set()  # it exited

    threading.Thread(target=copy, daemon=True).start()
    if not ready.wait(120):
        proc.kill()
        proc.wait(30)
        raise TimeoutError(f"the {backend} donor did not listen in 120 s: {log.read_text()[-500:]}")
    return proc, listening.is_set()


def lease_env(secret: bytes, port: int, workdir: Path) -> dict[str, str]:
    token = tokens.issue(secret, secrets.randbelow(1 << 40) + 1, DONOR, 3600)
    path = workdir / f"token-{token.lease}"
    tokens.write(path, token)
    return {
        "REMOTE_GPU_ENDPOINT": f"127.0.0.1:{port}",
        "REMOTE_GPU_TOKEN_FILE": str(path),
        "REMOTE_GPU_LEASE": str(token.lease),
        "REMOTE_GPU_TRANSPORT": "tcp",
    }


def workload(env: dict[str, str]) -> dict[str, Any]:
    """The pod's workload against the donor, as its own process."""
    argv = [sys.executable, "-m", "remote_gpu.workloads.matmul", "--size", "1024", "--calls", "4"]
    done = subprocess.run(
        argv, env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=300, check=False,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    out: dict[str, Any] = json.loads(lines[-1]) if lines else {"ok": False}
    out["exit"] = done.returncode
    if not lines:
        out["error"] = done.stderr.strip()[-500:]
    return out


def remote_figures(env: dict[str, str], n: int, reps: int, numpy_s: float) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    with RemoteGPU.from_env(env, timeout=300) as gpu:
        (product,) = gpu.invoke("matmul", a, b)
        correct = bool(np.allclose(product, a @ b, rtol=1e-3, atol=1e-2 * n**0.5))
        call_s = median_time(lambda: gpu.invoke("matmul", a, b), reps)
    return {
        f"products_correct_{n}": correct,
        f"remote_call_s_{n}": round(call_s, 6),
        f"speedup_remote_{n}": round(numpy_s / call_s, 3),
        f"remote_bytes_per_s_{n}": round(3 * a.nbytes / call_s),
    }


def backend_figures(name: str, n: int, reps: int, numpy_s: float) -> dict[str, Any]:
    """The backend in this process: its matmul with copies, and host to device."""
    if name == "numpy":
        return {}
    backend = backends.detect(name)
    assert backend is not None  # detect raises for a named backend without a GPU
    lib = backend.namespace
    sync = lib.cuda.Stream.null.synchronize if name == "cupy" else lib.cuda.synchronize
    matmul = backends.place("remote_gpu.builtins:matmul", builtins.matmul, backend)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    kernel_s = median_time(lambda: matmul(a, b), reps, sync)
    # The kernel alone, its operands already on the device: what the copies cost above.
    da, db = backend.to_device(a), backend.to_device(b)
    resident_s = median_time(lambda: lib.matmul(da, db), reps, sync)
    host = np.ones(H2D_BYTES // 4, dtype=np.float32)
    h2d_s = median_time(lambda: backend.to_device(host), reps, sync)
    return {
        f"backend_call_s_{n}": round(kernel_s, 6),
        f"speedup_backend_{n}": round(numpy_s / kernel_s, 3),
        f"resident_kernel_s_{n}": round(resident_s, 6),
        f"speedup_resident_{n}": round(numpy_s / resident_s, 3),
        "h2d_bytes_per_s": round(H2D_BYTES / h2d_s),
    }


def check_backend(name: str, n: int, reps: int, numpy_s: float, workdir: Path) -> dict[str, Any]:
    secret = secrets.token_hex(32).encode()
    secret_file = workdir / f"secret-{name}"
    secret_file.write_bytes(secret)
    port, log = free_port(), workdir / f"donor-{name}.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc, listening = start_donor(name, secret_file, port, log)
        if not listening:
            proc.wait(30)
            return {"ok": False, "error": log.read_text().strip()[-500:]}
        env = lease_env(secret, port, workdir)
        out: dict[str, Any] = {"workload": workload(env)}
        out |= remote_figures(lease_env(secret, port, workdir), n, reps, numpy_s)
        out |= backend_figures(name, n, reps, numpy_s)
        out["products_correct"] = out["workload"]["ok"] is True and out[f"products_correct_{n}"]
        out["ok"] = out["products_correct"]
        return out
    except Exception as exc:  # one backend's failure is reported; the next one still runs
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="cupy,torch")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--size", type=int, default=4096, help="N of the N x N products")
    args = parser.parse_args(argv)
    n = args.size
    rng = np.random.default_rng(2)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    numpy_s = median_time(lambda: a @ b, args.reps)
    out: dict[str, Any] = {f"numpy_matmul_s_{n}": round(numpy_s, 6), "backends": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for name in args.backends.split(","):
            out["backends"][name] = check_backend(name, n, args.reps, numpy_s, Path(tmp))
    out["ok"] = all(b["ok"] for b in out["backends"].values())
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
