"""A gated run's feature gates (testbed/versions.py) reach the control plane's flags and
the real nodes' kubelet configuration alike."""

from __future__ import annotations

from pathlib import Path

from testbed.controlplane import ControlPlane
from testbed.realnode import kubelet_config

GATES = {"DRAPartitionableDevices": True, "DRADeviceBindingConditions": True}


def test_the_control_plane_passes_its_gates_sorted_or_none(tmp_path: Path) -> None:
    gated = ControlPlane(tmp_path / "bin", workdir=tmp_path / "a", feature_gates=GATES)
    assert gated._gates_flag() == [
        "--feature-gates=DRADeviceBindingConditions=true,DRAPartitionableDevices=true"
    ]
    assert ControlPlane(tmp_path / "bin", workdir=tmp_path / "b")._gates_flag() == []


def test_a_kubelet_gets_the_clusters_gates_or_none(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    assert kubelet_config(tmp_path, ca, 1, 2, feature_gates=GATES)["featureGates"] == GATES
    assert "featureGates" not in kubelet_config(tmp_path, ca, 1, 2)
    assert "featureGates" not in kubelet_config(tmp_path, ca, 1, 2, feature_gates={})
