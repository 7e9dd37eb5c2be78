"""The scale benchmark, tiny, so that it keeps working: its own control plane with an
audit log, fake nodes whose local GPUs are all taken, two bursts of pool claims."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hack.bench import scale

pytestmark = pytest.mark.e2e


def test_scale_bench_tiny(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    scale.main(
        [
            "--nodes=6",
            "--zones=2",
            "--pool-gpus=16",
            "--gpus-per-node=2",
            "--first=2",
            "--claims=4",
            "--timeout=60",
            f"--workdir={tmp_path}",
        ]
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["claims"] == 4
    # The defaults: the scheduler's own and the publisher's window sized to the claims.
    assert out["percentage_of_nodes_to_score"] == 0 and out["pool_window"] == "auto"
    assert out["all_ready"] is True and out["ready"] == 4
    assert [b["claims"] for b in out["bursts"]] == [2, 4]
    assert out["ready_p50_s"] is not None and out["ready_p99_s"] >= out["ready_p50_s"]
    assert out["cost_ratio_1000_vs_100"] is not None and out["cost_ratio_1000_vs_100"] > 0
    assert set(out["max_rss_mb"]) == {"operator", "pool-publisher", "scaler", "max"}
    # Every component of the attach flow wrote, and the audit log named who.
    scaler = out["writes_in_burst"]["scaler"]
    assert scaler["create composableresources"] >= 4  # one resource a claim
    assert scaler["patch resourceclaims/status"] >= 4  # FabricDeviceReady
    assert out["writes_in_burst"]["plugin"] == {"patch composableresources/status": 4}
    assert out["attaches"] >= 4 and out["writes_per_attach"]["operator"] >= 1
    assert set(out["goals"]) >= {
        "all_ready",
        "ready_p99_s",
        "cpu_per_claim_s",
        "cost_ratio_1000_vs_100",
        "relists_after_start",
        "writes_per_attach",
    }
