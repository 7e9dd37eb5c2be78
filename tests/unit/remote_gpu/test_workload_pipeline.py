"""The pipeline workload with two blocks over real HTTP: frames spread, results checked in
order, a wrong result counted."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from remote_gpu.client import Result
from remote_gpu.workloads import pipeline
from remote_gpu.workloads.block import Pipeline as ToPipeline
from remote_gpu.workloads.block import work


class Matmul:
    """A block's GPU; with ``meet``, its first call waits there for the other blocks' (so
    every block is seen to take a frame, however the threads are scheduled)."""

    def __init__(self, lease: int, wrong: bool = False, meet: threading.Barrier | None = None):
        self.lease, self.wrong, self.meet = lease, wrong, meet

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        if self.meet is not None:
            self.meet.wait(10)
            self.meet = None
        out = np.matmul(arrays[0], arrays[1])
        return (out + 1 if self.wrong else out,)

    def close(self) -> None:
        pass


def run_with(blocks: list[Matmul], frames: int) -> dict[str, Any]:
    args = ["--listen", "127.0.0.1:0", "--fps", "200", "--size", "8", "--frames", str(frames)]
    p = pipeline.Pipeline(pipeline.parse(args))
    http = p.serve()
    stop = threading.Event()
    url = f"http://{http.host}:{http.port}"
    threads = [
        threading.Thread(
            target=work, args=(b, ToPipeline(url, f"lease-{b.lease}"), "matmul", stop), daemon=True
        )
        for b in blocks
    ]
    for t in threads:
        t.start()
    out = p.run()
    stop.set()
    for t in threads:
        t.join(10)
    return out


def test_frames_spread_over_the_blocks_and_every_result_is_checked() -> None:
    meet = threading.Barrier(2)
    out = run_with([Matmul(1, meet=meet), Matmul(2, meet=meet)], 40)
    assert out["ok"] is True and out["frames"] == 40, out
    assert set(out["by_block"]) == {"lease-1", "lease-2"}


def test_a_wrong_result_fails_the_pipeline() -> None:
    out = run_with([Matmul(1, wrong=True)], 3)
    assert out["ok"] is False and out["wrong"] == [0, 1, 2]
