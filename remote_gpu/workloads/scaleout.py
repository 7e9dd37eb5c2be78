"""A pipeline stage scaled out over a pod's remote GPUs: frames/s at every count.

``python -m remote_gpu.workloads.scaleout --frame-kib 64 --seconds 4`` opens every lease
of the claim (``RemoteGPU.all_from_env()``), measures the knee model's inputs that the
pod can see (``remote_gpu.knee``): the bytes a frame puts on the link each way and one
GPU's time per frame (the median round trip of a frame of a few bytes, where the link
adds nothing), then, for each count ``n`` from 1 to the leases it holds, streams frames
over the first ``n`` (``RemoteGPUPool``, ``--per-lease`` in flight on each, results in
frame order, each checked) for ``--seconds`` after a warm-up, and prints one JSON line:
``fps_by_leases`` and the inputs. The donor's function is ``feature_extract`` by default:
it waits a fixed 66 ms per frame, which models the GPU time of a Re-ID feature stage
without burning a CPU (this machine has no GPU); the line says so (``gpu_time``).
Exit 0, or 1 on a wrong result, 2 on a typed error of the service.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from remote_gpu.client import RemoteGPU
from remote_gpu.errors import RemoteGPUError
from remote_gpu.metrics import PIPELINE_FPS
from remote_gpu.pool import Lease, RemoteGPUPool

OK, WRONG, SERVICE_ERROR = 0, 1, 2
GPU_TIME = "modelled: the donor's feature_extract waits a fixed time per frame (GPU time)"


def expected(frame: np.ndarray) -> np.ndarray:
    """What ``feature_extract`` answers: the frame's first 256 values."""
    return frame.reshape(-1)[:256]


def compute_seconds(gpu: Lease, function: str, samples: int) -> float:
    """One GPU's time per frame: the median round trip of a 256-value frame."""
    tiny = np.arange(256, dtype=np.float32)
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        gpu.invoke(function, tiny)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def frames(stock: Sequence[np.ndarray], until: float) -> Iterator[tuple[np.ndarray]]:
    i = 0
    while time.monotonic() < until:
        yield (stock[i % len(stock)],)
        i += 1


def sweep_one(
    gpus: Sequence[Lease], args: argparse.Namespace, stock: Sequence[np.ndarray]
) -> tuple[float, bool]:
    """(frames/s over the window, every result right) with ``gpus``."""
    warm_until = time.monotonic() + args.warmup
    until = warm_until + args.seconds
    counted, right = 0, True
    with RemoteGPUPool(gpus, args.per_lease, owns=False) as pool:
        results = pool.map(args.function, frames(stock, until), ordered=True)
        for i, (feature,) in enumerate(results):
            right = right and bool(np.array_equal(feature, expected(stock[i % len(stock)])))
            if warm_until <= time.monotonic() <= until:
                counted += 1
    fps = counted / args.seconds
    PIPELINE_FPS.set(fps)
    return fps, right


def run(gpus: Sequence[Lease], args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed)
    stock = [rng.standard_normal(args.frame_kib * 256, dtype=np.float32) for _ in range(4)]
    out: dict[str, Any] = {"leases": [g.lease for g in gpus], "gpu_time": GPU_TIME}
    out["frame_bytes"] = stock[0].nbytes
    out["result_bytes"] = expected(stock[0]).nbytes
    out["compute_s"] = round(compute_seconds(gpus[0], args.function, args.samples), 6)
    fps_by: dict[str, float] = {}
    ok = True
    for n in range(1, len(gpus) + 1):
        fps, right = sweep_one(gpus[:n], args, stock)
        fps_by[str(n)] = round(fps, 2)
        ok = ok and right
        print(json.dumps({"leases": n, "fps": fps_by[str(n)]}), file=sys.stderr, flush=True)
    out["fps_by_leases"] = fps_by
    out["ok"] = ok
    return out


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frame-kib", type=int, default=64, help="frame size (float32 values)")
    p.add_argument("--seconds", type=float, default=4.0, help="measured time per count")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured time per count")
    p.add_argument("--per-lease", type=int, default=2, help="frames in flight per GPU")
    p.add_argument("--samples", type=int, default=7, help="round trips for the compute time")
    p.add_argument("--function", default="feature_extract")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.frame_kib, args.per_lease, args.samples) < 1 or args.seconds <= 0:
        p.error("--frame-kib, --per-lease, --samples and --seconds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out: dict[str, Any] = {"function": args.function, "where": "remote"}
    gpus: list[RemoteGPU] = []
    try:
        gpus = RemoteGPU.all_from_env()
        out.update(run(gpus, args))
        code = OK if out["ok"] else WRONG
    except RemoteGPUError as exc:
        out.update(ok=False, error=exc.message, code=str(exc.code))
        code = SERVICE_ERROR
    finally:
        for g in gpus:
            g.close()
    print(json.dumps(out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
