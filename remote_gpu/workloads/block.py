"""A functional block: one pod's remote GPU serving a pipeline's frames.

``python -m remote_gpu.workloads.block --pipeline http://reid-pipeline:7480`` opens the
pod's lease (``RemoteGPU.from_env()``), then ``--in-flight`` workers each pull a frame
from the pipeline (``remote_gpu.block_wire``), run ``--function`` on it on the remote
GPU and answer with the results. The pipeline keeps the block to that many unanswered
frames, so the workers are the block's bound too. A pipeline that cannot be reached is
retried (the suite's retry policy) until it can; a typed error of the remote GPU ends
the block (exit 2) and its frames go to the other blocks. Its name at the pipeline is
``--name``, else ``POD_NAME`` (the downward API), else ``lease-<lease>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from composable_dra.k8s import retry
from remote_gpu import block_wire
from remote_gpu.block_server import Arrays
from remote_gpu.client import RemoteGPU
from remote_gpu.errors import RemoteGPUError

SERVICE_ERROR = 2
HTTP_TIMEOUT = 30.0


class Pipeline:
    """The pipeline's HTTP side as one block sees it."""

    def __init__(self, url: str, block: str) -> None:
        self.url, self.block = url.rstrip("/"), block

    def _post(self, route: str, query: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        q = urllib.parse.urlencode({"block": self.block, **query})
        req = urllib.request.Request(f"{self.url}{route}?{q}", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as resp:
            return resp.status, resp.read(), resp.headers.get(block_wire.FRAME_HEADER, "")

    def take(self) -> tuple[int, Arrays] | None:
        status, body, frame = self._post("/v1/take", {}, b"")
        if status == 204:
            return None
        seq = block_wire.frame_number({"frame": frame})
        return seq, block_wire.decode(body)

    def answer(self, seq: int, results: Arrays) -> None:
        self._post("/v1/answer", {"frame": str(seq)}, block_wire.encode(results))


def work(gpu: RemoteGPU, pipeline: Pipeline, function: str, stop: threading.Event) -> None:
    """Pull, compute, answer, until ``stop``; a typed remote-GPU error sets it."""
    while not stop.is_set():
        got = retry.forever(pipeline.take, stop, cap=5.0)
        if got is None:
            continue
        seq, arrays = got
        try:
            results = gpu.invoke(function, *arrays)
        except RemoteGPUError as exc:
            print(f"block stops: {exc.code}: {exc.message}", file=sys.stderr, flush=True)
            stop.set()
            raise
        retry.forever(lambda: pipeline.answer(seq, results), stop, cap=5.0)


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
            except RemoteGPUError as exc:
                failed.append(exc)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.in_flight)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return SERVICE_ERROR if failed else 0


if __name__ == "__main__":
    sys.exit(main())
