"""A functional block: one pod's remote GPU serving a pipeline's frames.

``python -m remote_gpu.workloads.block --pipeline http://reid-pipeline:7480`` opens the
pod's lease (``RemoteGPU.from_env()``), then ``--in-flight`` workers each pull a frame
from the pipeline (``remote_gpu.block_wire``), run ``--function`` on it on the remote
GPU and answer with the results. The pipeline keeps the block to that many unanswered
frames, so the workers are the block's bound too. A pipeline that cannot be reached is
retried (the suite's retry policy) until it can; a typed error of the remote GPU, or a
request the pipeline refuses (4xx: asking again changes nothing), ends the block (exit
2) and its frames go to the other blocks. An answer refused as not held (409: the
pipeline took the block for gone and gave the frame to another) is dropped. Its name at
the pipeline is ``--name``, else ``POD_NAME`` (the downward API), else ``lease-<lease>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TypeVar

import urllib3

from composable_dra.k8s import retry
from remote_gpu import block_wire
from remote_gpu.block_server import Arrays
from remote_gpu.client import RemoteGPU
from remote_gpu.errors import RemoteGPUError
from remote_gpu.pool import Lease

T = TypeVar("T")
SERVICE_ERROR = 2
HTTP_TIMEOUT = 30.0
NOT_HELD = 409


class PipelineRefused(RuntimeError):
    """The pipeline answered with an error status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"pipeline answered {status}: {body[:200]!r}")
        self.status = status


class Pipeline:
    """The pipeline's HTTP side as one block sees it."""

    def __init__(self, url: str, block: str) -> None:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"the pipeline's URL must be http(s): {url!r}")
        self.url, self.block = url.rstrip("/"), block
        self._http = urllib3.PoolManager(retries=False, timeout=HTTP_TIMEOUT)

    def _post(self, route: str, query: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        q = urllib.parse.urlencode({"block": self.block, **query})
        resp = self._http.request("POST", f"{self.url}{route}?{q}", body=body)
        if resp.status >= 300:
            raise PipelineRefused(resp.status, resp.data)
        return resp.status, resp.data, resp.headers.get(block_wire.FRAME_HEADER, "")

    def take(self) -> tuple[int, Arrays] | None:
        status, body, frame = self._post("/v1/take", {}, b"")
        if status == 204:
            return None
        seq = block_wire.frame_number({"frame": frame})
        return seq, block_wire.decode(body)

    def answer(self, seq: int, results: Arrays) -> None:
        self._post("/v1/answer", {"frame": str(seq)}, block_wire.encode(results))


def _once(fn: Callable[[], T], stop: threading.Event) -> T | PipelineRefused | None:
    """``fn()``, retried while the pipeline cannot be reached or fails (5xx); a refusal
    of the request itself (4xx) is returned, not retried. None once ``stop`` is set."""

    def attempt() -> T | PipelineRefused:
        try:
            return fn()
        except PipelineRefused as exc:
            if exc.status < 500:
                return exc
            raise

    return retry.forever(attempt, stop, cap=5.0)


def work(gpu: Lease, pipeline: Pipeline, function: str, stop: threading.Event) -> None:
    """Pull, compute, answer, until ``stop``; a typed remote-GPU error or a refused
    request ends the block (raised), and sets ``stop`` for its other workers."""
    while not stop.is_set():
        got = _once(pipeline.take, stop)
        if got is None:
            continue
        if isinstance(got, PipelineRefused):
            stop.set()
            raise got
        seq, arrays = got
        try:
            results = gpu.invoke(function, *arrays)
        except RemoteGPUError:
            stop.set()
            raise

        def answer(seq: int = seq, results: Arrays = results) -> None:
            pipeline.answer(seq, results)

        answered = _once(answer, stop)
        if isinstance(answered, PipelineRefused) and answered.status != NOT_HELD:
            stop.set()
            raise answered


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pipeline", required=True, help="the pipeline's URL (its Service)")
    p.add_argument("--function", default="matmul", help="the donor's function for a frame")
    p.add_argument("--in-flight", type=int, default=2, help="frames this block works on at once")
    p.add_argument("--name", help="this block's name at the pipeline")
    args = p.parse_args(argv)
    if args.in_flight < 1:
        p.error("--in-flight must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    stop = threading.Event()
    failed: list[BaseException] = []
    with RemoteGPU.from_env() as gpu:
        name = args.name or os.environ.get("POD_NAME") or f"lease-{gpu.lease}"
        pipeline = Pipeline(args.pipeline, name)

        def worker() -> None:
            try:
                work(gpu, pipeline, args.function, stop)
            except (RemoteGPUError, PipelineRefused) as exc:
                print(f"block {name} stops: {exc}", file=sys.stderr, flush=True)
                failed.append(exc)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.in_flight)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return SERVICE_ERROR if failed else 0


if __name__ == "__main__":
    sys.exit(main())
