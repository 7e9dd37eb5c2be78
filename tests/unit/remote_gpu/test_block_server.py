"""The pipeline's block server and a block's client, over real HTTP on this host."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import urllib3

from remote_gpu import block_wire
from remote_gpu.block_server import BlockServer, silent
from remote_gpu.client import Result
from remote_gpu.workloads.block import Pipeline, PipelineRefused, work

NOW = [0.0]  # the server's clock, moved by the tests


@pytest.fixture
def served() -> Iterator[tuple[BlockServer, str]]:
    server = BlockServer(bound=2, silent_after=5.0, clock=lambda: NOW[0])
    http = server.serve("127.0.0.1", 0)
    yield server, f"http://{http.host}:{http.port}"
    asyncio.run_coroutine_threadsafe(http.cleanup(), http.loop).result(10)


def test_silent_blocks_are_those_not_heard_from_in_time() -> None:
    assert silent({"a": 10.0, "b": 14.5}, 15.0, 1.0) == ["a"]
    assert silent({}, 15.0, 1.0) == []


def test_a_block_takes_frames_up_to_its_bound_and_answers_them(
    served: tuple[BlockServer, str],
) -> None:
    server, url = served
    for i in range(3):
        server.frames.submit((np.full(4, i, dtype=np.float32),))
    block = Pipeline(url, "block-a")
    got = [block.take(), block.take()]
    assert [g[0] for g in got if g] == [0, 1]
    assert block.take() is None  # at its bound: 204 once the wait ends
    block.answer(1, (np.array([10.0]),))
    block.answer(0, (np.array([0.0]),))
    ready = server.frames.ready(5)
    assert [(seq, who) for seq, (who, _) in ready] == [(0, "block-a"), (1, "block-a")]


def test_a_repeated_answer_and_bad_requests_are_refused(served: tuple[BlockServer, str]) -> None:
    server, url = served
    server.frames.submit((np.zeros(2),))
    block = Pipeline(url, "block-a")
    assert block.take() is not None
    block.answer(0, (np.zeros(1),))
    with pytest.raises(PipelineRefused) as again:
        block.answer(0, (np.zeros(1),))
    assert again.value.status == 409
    with pytest.raises(PipelineRefused) as bad:
        Pipeline(url, "Not_A_Label").take()
    assert bad.value.status == 400
    http = urllib3.PoolManager(retries=False, timeout=5)
    junk = http.request("POST", f"{url}/v1/answer?block=b&frame=0", body=b"junk")
    assert junk.status == 400 and b"bad_request" in junk.data
    assert b"remote_gpu_pipeline_queue_frames" in http.request("GET", f"{url}/metrics").data
    with pytest.raises(ValueError, match="http"):
        Pipeline("file:///etc/passwd", "b")


def test_a_silent_blocks_frames_go_to_another(served: tuple[BlockServer, str]) -> None:
    server, url = served
    server.frames.submit((np.zeros(2),))
    assert Pipeline(url, "gone").take() is not None
    assert server.reap() == []
    NOW[0] += 6.0  # past silent_after
    assert server.reap() == ["gone"]
    assert Pipeline(url, "other").take() is not None


class Doubling:
    lease = 7

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        assert name == "matmul"
        return (arrays[0] * 2,)

    def close(self) -> None:
        pass


def test_a_blocks_workers_compute_every_frame(served: tuple[BlockServer, str]) -> None:
    server, url = served
    for i in range(6):
        server.frames.submit((np.full(2, i, dtype=np.float32),))
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=work, args=(Doubling(), Pipeline(url, "lease-7"), "matmul", stop), daemon=True
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    results: list[float] = []
    while len(results) < 6:
        got = server.frames.ready(10)
        assert got, "no result in 10 s"
        results += [float(r[0][0]) for _, (_, r) in got]
    stop.set()
    for t in threads:
        t.join(10)
    assert results == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert block_wire.FRAME_HEADER == "X-Frame"


class ReapedOnce(Doubling):
    """Computes, but the first time the pipeline takes the block for gone meanwhile."""

    def __init__(self, server: BlockServer, block: str) -> None:
        self.server, self.block, self.reaped = server, block, False

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        if not self.reaped:
            self.reaped = True
            assert self.server.frames.lost(self.block) == [0]
        return super().invoke(name, *arrays)


def test_an_answer_not_held_is_dropped_and_the_frame_computed_again(
    served: tuple[BlockServer, str],
) -> None:
    server, url = served
    server.frames.submit((np.ones(2, dtype=np.float32),))
    stop = threading.Event()
    worker = threading.Thread(
        target=work,
        args=(ReapedOnce(server, "lease-7"), Pipeline(url, "lease-7"), "matmul", stop),
        daemon=True,
    )
    worker.start()
    ready = server.frames.ready(10)  # the 409 answer dropped; frame 0 taken and answered again
    stop.set()
    worker.join(10)
    assert [(seq, float(r[0][0])) for seq, (_, r) in ready] == [(0, 2.0)]
    assert not worker.is_alive()


def test_a_refused_take_ends_the_block(served: tuple[BlockServer, str]) -> None:
    _, url = served
    stop = threading.Event()
    with pytest.raises(PipelineRefused) as refused:
        work(Doubling(), Pipeline(url, "Bad_Name"), "matmul", stop)
    assert refused.value.status == 400 and stop.is_set()
