"""testbed.controlplane: which admission plugins the local API server leaves off."""

from __future__ import annotations

from pathlib import Path

from testbed.controlplane import ControlPlane


def test_service_account_admission_is_off_unless_asked(tmp_path: Path) -> None:
    # Off: a pod in a namespace whose default service account is not made yet is admitted.
    plain = ControlPlane(tmp_path / "bin", workdir=tmp_path / "a")
    assert "ServiceAccount" in plain._disabled_admission()
    # On (the chart's pods need their tokens mounted); the rest stays off.
    chart = ControlPlane(tmp_path / "bin", workdir=tmp_path / "b", service_account_admission=True)
    assert chart._disabled_admission() == ["TaintNodesByCondition"]
