"""The scale-out workload: FPS at every lease count, each result checked in order."""

from __future__ import annotations

import numpy as np

from remote_gpu.client import Result
from remote_gpu.workloads import scaleout


class Stage:
    """A lease that answers ``feature_extract`` at once (``wrong``: with a bad value)."""

    def __init__(self, lease: int, wrong: bool = False) -> None:
        self.lease, self.wrong, self.calls = lease, wrong, 0

    def invoke(self, name: str, *arrays: np.ndarray) -> Result:
        assert name == "feature_extract"
        self.calls += 1
        out = scaleout.expected(arrays[0]).copy()
        if self.wrong:
            out[0] += 1
        return (out,)

    def close(self) -> None:
        raise AssertionError("the workload's sweep must leave its leases open")


def args(*extra: str) -> object:
    return scaleout.parse(["--seconds", "0.2", "--warmup", "0", "--frame-kib", "4", *extra])


def test_every_count_is_measured_and_every_lease_computes() -> None:
    gpus = [Stage(i) for i in range(3)]
    out = scaleout.run(gpus, args())  # type: ignore[arg-type]
    assert out["ok"] is True and sorted(out["fps_by_leases"]) == ["1", "2", "3"]
    assert all(fps > 0 for fps in out["fps_by_leases"].values())
    assert out["frame_bytes"] == 4096 and out["result_bytes"] == 1024
    assert out["compute_s"] >= 0 and "modelled" in out["gpu_time"]
    assert all(g.calls > 0 for g in gpus)


def test_a_wrong_result_fails_the_run() -> None:
    out = scaleout.run([Stage(0), Stage(1, wrong=True)], args())  # type: ignore[arg-type]
    assert out["ok"] is False


def test_a_run_without_leases_is_a_typed_error(capsys: object) -> None:
    assert scaleout.main(["--seconds", "0.1"]) == scaleout.SERVICE_ERROR
