"""A pipeline stage spread over functional blocks: the example's frame source and sink.

``python -m remote_gpu.workloads.pipeline --listen 0.0.0.0:7480 --fps 20`` makes frames
at ``--fps`` (matrix pairs, ``--size``), serves them to the blocks that pull them
(``remote_gpu.block_server``: at most ``--in-flight`` unanswered per block, a silent
block's frames given out again), takes the results in frame order and checks each
against numpy here. It exports, on the same port's ``/metrics``, the queue depth
(``remote_gpu_pipeline_queue_frames``: what the example's HPA scales the blocks by), the
frames/s of results and each block's answered frames. A frame that finds ``--max-queue``
frames waiting is dropped, as a camera's would be, and counted. Runs until stopped, or
``--frames`` results; then prints one JSON line (``frames``, ``by_block``, ``wrong``)
and exits 0, or 1 when a result was wrong.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from composable_dra.serving.http import HttpServer
from remote_gpu.block_server import Arrays, BlockServer
from remote_gpu.metrics import (
    ERRORS,
    PIPELINE_DROPPED,
    PIPELINE_FPS,
    PIPELINE_FRAMES,
    PIPELINE_QUEUE,
)
from remote_gpu.workloads.matmul import correct

FPS_WINDOW = 5.0  # seconds of results the FPS gauge averages over


def stock(size: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Four left operands, taken in turn, and the right one."""
    rng = np.random.default_rng(seed)
    lefts = [rng.standard_normal((size, size), dtype=np.float32) for _ in range(4)]
    return lefts, rng.standard_normal((size, size), dtype=np.float32)


class Pipeline:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.server = BlockServer(args.in_flight, args.silent_after)
        self.lefts, self.right = stock(args.size, args.seed)
        self.stop = threading.Event()
        self.by_block: collections.Counter[str] = collections.Counter()
        self.wrong: list[int] = []
        self.done_at: collections.deque[float] = collections.deque()

    def frame(self, seq: int) -> Arrays:
        return self.lefts[seq % len(self.lefts)], self.right

    def source(self) -> None:
        """Frames at the source's rate; the wait is that rate, not a synchronisation."""
        period, next_at, seq = 1.0 / self.args.fps, time.monotonic(), 0
        while not self.stop.is_set():
            if self.server.frames.depth >= self.args.max_queue:
                PIPELINE_DROPPED.inc()
            else:
                self.server.frames.submit(self.frame(seq))
                seq += 1
            PIPELINE_QUEUE.set(self.server.frames.depth)
            next_at += period
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def sink(self) -> None:
        """Results in frame order, each checked; gauges updated; silent blocks reaped."""
        while not self.stop.is_set():
            for seq, (block, results) in self.server.frames.ready(1.0):
                a, b = self.frame(seq)
                if not (len(results) == 1 and correct(a, b, results[0])):
                    self.wrong.append(seq)
                    ERRORS.labels("pipeline", "wrong_result").inc()
                self.by_block[block] += 1
                PIPELINE_FRAMES.labels(block).inc()
                self.done_at.append(time.monotonic())
                if self.args.frames and sum(self.by_block.values()) >= self.args.frames:
                    self.stop.set()
                    break
            now = time.monotonic()
            while self.done_at and now - self.done_at[0] > FPS_WINDOW:
                self.done_at.popleft()
            PIPELINE_FPS.set(len(self.done_at) / FPS_WINDOW)
            self.server.reap()

    def serve(self) -> HttpServer:
        """The blocks' server, listening, and the frame source, started."""
        host, port = self.args.listen.rsplit(":", 1)
        http = self.server.serve(host, int(port))
        threading.Thread(target=self.source, name="source", daemon=True).start()
        return http

    def run(self) -> dict[str, Any]:
        """Results until stopped (``--frames``); what came of them."""
        self.sink()
        return {
            "ok": not self.wrong,
            "frames": sum(self.by_block.values()),
            "by_block": dict(sorted(self.by_block.items())),
            "wrong": self.wrong[:8],
        }


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", default="0.0.0.0:7480", help="host:port for blocks and metrics")
    p.add_argument("--fps", type=float, default=20.0, help="frames made per second")
    p.add_argument("--size", type=int, default=64, help="N of the N x N frames")
    blocks = p.add_argument_group("blocks")
    blocks.add_argument("--in-flight", type=int, default=2, help="frames one block may hold")
    blocks.add_argument("--max-queue", type=int, default=256, help="frames waiting, at most")
    blocks.add_argument("--silent-after", type=float, default=10.0, help="s: a block is gone")
    p.add_argument("--frames", type=int, default=0, help="stop after this many results (0: never)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.fps, args.size, args.in_flight, args.max_queue, args.silent_after) <= 0:
        p.error("--fps, --size, --in-flight, --max-queue and --silent-after must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    pipeline = Pipeline(parse(argv))
    pipeline.serve()
    out = pipeline.run()
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
