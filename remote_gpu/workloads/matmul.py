"""A pod's workload on a lent GPU: matrix products on the donor, checked here.

``python -m remote_gpu.workloads.matmul --size N --calls K`` connects with
``ReconnectingGPU.from_env()`` (what the claim's CDI spec injected; it connects again on
its own within ``--reconnect-within`` seconds after its donor restarted), multiplies ``K`` pairs of
random float32 matrices (``N x N`` by ``N x --cols``, square by default) with the
donor's ``matmul`` and checks each product against numpy here. It prints one JSON line
(``ok``, ``calls``, ``bytes`` moved both ways, ``seconds`` spent in calls, ``GBps`` of
payload, ``lease``, ``function``) and exits 0; 1 when a product is wrong, 2 on a typed
error of the remote GPU service (its ``code`` in the line), 3 when what the CDI spec
should have given is missing. ``--seconds S`` keeps calling for S seconds instead (at
least ``--calls`` calls): a steady load. ``--local-fallback``: a claim that may be
served by a GPU of the pod's own node (no lease in the env) computes here instead, on
that GPU where a GPU library sees it (``remote_gpu.backends``), and says
``"where": "local"``. It prints a line with its PID first (``"event": "started"``), and
the last line adds ``pid``, ``reconnects`` and ``failed_calls``: the calls lost with a
connection and not run again (a function the donor does not declare idempotent; each is
counted and the loop goes on). ``--all-leases``: a claim for several remote GPUs; every lease is
opened (``RemoteGPUPool.from_env()``), the calls are spread over them (one in flight on
each, results in call order, each product checked) and the line adds ``leases`` and
``calls_by_lease``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from remote_gpu import backends, builtins
from remote_gpu.errors import CallInterrupted, RemoteGPUError
from remote_gpu.pool import RemoteGPUPool
from remote_gpu.reconnect import ReconnectingGPU

OK, WRONG, SERVICE_ERROR, NOT_CONFIGURED = 0, 1, 2, 3
REQUIRED = ("REMOTE_GPU_ENDPOINT", "REMOTE_GPU_TOKEN_FILE")
# float32 products of sums of N terms: relative error grows with N; numpy and a GPU's
# BLAS sum in different orders.
RTOL, ATOL = 1e-4, 1e-3


def correct(a: np.ndarray, b: np.ndarray, product: np.ndarray) -> bool:
    expected = np.matmul(a, b)
    return product.shape == expected.shape and bool(
        np.allclose(product, expected, rtol=RTOL, atol=ATOL * a.shape[-1] ** 0.5)
    )


class Local:
    """The same calls on this node: its GPU where a GPU library sees one, else numpy."""

    def __init__(self, backend: backends.Backend | None) -> None:
        self._matmul = backends.place("remote_gpu.builtins:matmul", builtins.matmul, backend)

    def invoke(self, name: str, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        if name != "matmul":
            raise RemoteGPUError(f"{name!r} has no local implementation")
        return (self._matmul(*arrays),)


def operands(size: int, cols: int | None, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Two left operands, taken in turn (consecutive calls compute different products),
    and the right one."""
    rng = np.random.default_rng(seed)
    lefts = [rng.standard_normal((size, size), dtype=np.float32) for _ in range(2)]
    return lefts, rng.standard_normal((size, cols or size), dtype=np.float32)


def run_pool(pool: RemoteGPUPool, args: argparse.Namespace) -> dict[str, Any]:
    """``--calls`` products (at least one per lease) spread over the pool's leases, each
    checked in call order."""
    lefts, b = operands(args.size, args.cols, args.seed)
    calls = max(args.calls, len(pool.gpus))
    start = time.perf_counter()
    results = pool.map(args.function, ((lefts[i % 2], b) for i in range(calls)))
    wrong = [i for i, (p,) in enumerate(results) if not correct(lefts[i % 2], b, p)]
    spent = time.perf_counter() - start
    moved = calls * (lefts[0].nbytes + 2 * b.nbytes)  # a, b and the product
    out: dict[str, Any] = {"ok": not wrong, "calls": calls, "bytes": moved}
    out |= {"seconds": round(spent, 6), "leases": pool.leases}
    out["calls_by_lease"] = {str(k): v for k, v in pool.calls_by_lease().items()}
    if wrong:
        out["error"] = f"wrong products: calls {wrong[:8]}"
    return out


def run(
    gpu: ReconnectingGPU | Local,
    size: int,
    calls: int,
    seconds: float,
    function: str,
    seed: int,
    cols: int | None = None,
) -> dict[str, Any]:
    lefts, b = operands(size, cols, seed)
    done = moved = failed = 0
    spent = 0.0
    until = time.monotonic() + seconds
    while done < calls or time.monotonic() < until:
        a = lefts[done % 2]
        start = time.perf_counter()
        try:
            (product,) = gpu.invoke(function, a, b)
        except CallInterrupted:
            failed += 1  # lost with its connection, not run again: the next call reconnects
            continue
        spent += time.perf_counter() - start
        done += 1
        moved += a.nbytes + b.nbytes + product.nbytes
        if not correct(a, b, product):
            return {
                "ok": False,
                "calls": done,
                "bytes": moved,
                "seconds": spent,
                "failed_calls": failed,
                "error": "wrong product",
            }
    return {
        "ok": True,
        "calls": done,
        "failed_calls": failed,
        "bytes": moved,
        "seconds": round(spent, 6),
        "GBps": round(moved / spent / 1e9, 4) if spent else None,
    }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=256, help="N of the N x N matrices")
    parser.add_argument(
        "--cols", type=int, help="columns of the right operand (default: N, square)"
    )
    parser.add_argument("--calls", type=int, default=4, help="products to compute (at least)")
    parser.add_argument("--seconds", type=float, default=0.0, help="keep calling this long")
    parser.add_argument("--function", default="matmul", help="the donor's name for matmul")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--reconnect-within",
        type=float,
        default=60.0,
        help="seconds to connect again after the lease's connection is lost (donor restart)",
    )
    parser.add_argument(
        "--all-leases",
        action="store_true",
        help="open every lease of the claim (REMOTE_GPUS) and spread the calls over them",
    )
    parser.add_argument(
        "--local-fallback",
        action="store_true",
        help="when the claim gave no remote GPU (no REMOTE_GPU_ENDPOINT), compute here",
    )
    args = parser.parse_args(argv)
    if args.size < 1 or args.calls < 1 or args.seconds < 0 or (args.cols or 1) < 1:
        parser.error("--size, --cols and --calls must be positive, --seconds not negative")
    if not args.reconnect_within > 0:
        parser.error("--reconnect-within must be positive")
    return args


def run_as_asked(gpu: ReconnectingGPU | Local, args: argparse.Namespace) -> dict[str, Any]:
    return run(gpu, args.size, args.calls, args.seconds, args.function, args.seed, args.cols)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out: dict[str, Any] = {"function": args.function, "size": args.size}
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing and args.local_fallback:
        # The claim gave a GPU of this node (local or attached): no lease to reach.
        here = backends.from_env()
        out.update(where="local", backend=here.name if here else "numpy")
        out.update(run_as_asked(Local(here), args))
        print(json.dumps(out), flush=True)
        return OK if out["ok"] else WRONG
    if missing:
        out.update(ok=False, error=f"not set: {', '.join(missing)}", code="not_configured")
        print(json.dumps(out), flush=True)
        return NOT_CONFIGURED
    print(json.dumps({"event": "started", "pid": os.getpid()}), flush=True)
    out["pid"] = os.getpid()
    code = OK
    try:
        if args.all_leases:
            with RemoteGPUPool.from_env(per_lease=1, within=args.reconnect_within) as pool:
                out.update(where="remote", lease=pool.leases[0])
                out.update(run_pool(pool, args))
        else:
            with ReconnectingGPU.from_env(within=args.reconnect_within) as gpu:
                out.update(where="remote", lease=gpu.lease, transport=gpu.transport)
                out.update(run_as_asked(gpu, args))
                out.update(lease=gpu.lease, reconnects=gpu.reconnects)
        code = OK if out["ok"] else WRONG
    except RemoteGPUError as exc:
        out.update(ok=False, error=exc.message, code=str(exc.code))
        code = SERVICE_ERROR
    except OSError as exc:
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}", code="unreachable")
        code = SERVICE_ERROR
    print(json.dumps(out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
