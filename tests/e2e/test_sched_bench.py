"""The scheduler bench, tiny, so that it keeps working: the real kube-scheduler allocates a
pool burst at the publisher's default window, then the same claims from free local GPUs.

The local burst is also the suite's claim against the real allocator: with a free local
GPU on every node, every claim's ``local`` alternative (the local DeviceClass) wins over
the pool's free GPUs that each node sees.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hack.bench import sched
from pool_publisher.window import MARGIN, MIN_WINDOW

pytestmark = pytest.mark.e2e

PODS = 6


def test_sched_bench_tiny(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sched.main(
        [
            "--nodes=4",
            "--zones=2",
            "--pool-gpus=80",
            "--gpus-per-node=2",
            f"--pods={PODS}",
            "--timeout=120",
            f"--workdir={tmp_path}",
        ]
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    pool, local = out["bursts"]["pool-auto"], out["bursts"]["local"]
    assert out["scheduler_config"] == {}  # the scheduler's defaults
    assert out["zone_selector"] == "label"  # the pools select their zone by one label
    assert pool["allocated"] == local["allocated"] == PODS
    assert pool["window"] == max(MIN_WINDOW, 3 + MARGIN)  # 6 claims pending over 2 pools
    assert pool["served_by"] == {"gpu/pool": PODS}
    assert local["served_by"] == {"gpu/local": PODS}
    assert pool["republish_writes"] >= 1  # each allocation's taint
    assert out["goals"]["local_burst_served_locally"]["met"]
    assert {"pool_vs_local_cpu_per_claim", "pool_vs_local_claims_per_s"} <= set(out["goals"])
    assert out["goals"]["pool_vs_local_cpu_per_claim"]["value"] is not None
