"""A real node's KubeletConfiguration: a suite's overrides replace the defaults' fields."""

from __future__ import annotations

from pathlib import Path

from testbed.realnode import kubelet_config, overridden


def test_overrides_replace_the_kubelets_defaults(tmp_path: Path) -> None:
    base = kubelet_config(tmp_path, tmp_path / "ca.crt", 10250, 10248)
    assert "syncFrequency" not in base  # the kubelet's own: one minute
    told = overridden(base, {"syncFrequency": "2s", "nodeStatusUpdateFrequency": "5s"})
    assert told["syncFrequency"] == "2s"
    assert told["nodeStatusUpdateFrequency"] == "5s"  # over the default's 2s
    assert {k: v for k, v in told.items() if k != "syncFrequency"} == base | {
        "nodeStatusUpdateFrequency": "5s"
    }
    assert overridden(base, {}) == base
