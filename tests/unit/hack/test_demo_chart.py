"""hack.demo's --chart choice and hack.demo_chart.ChartSuite's reads."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest

from hack import demo
from hack.demo_chart import ChartSuite


def test_the_chart_is_a_choice_and_refused_on_kubelet_emulators() -> None:
    assert demo.parse_args(["--chart"]).chart
    assert not demo.parse_args([]).chart
    with pytest.raises(SystemExit, match="--chart installs on real nodes"):
        demo.main(["--chart", "--nodes=emulator"])


def test_a_chart_suite_reads_pods_as_the_demo_reads_a_suite() -> None:
    pods: dict[str, Any] = {
        "/api/v1/namespaces/demo/pods/up": {"status": {"phase": "Running"}},
        "/api/v1/namespaces/demo/pods/waiting": {"status": {"phase": "Pending"}},
    }
    kube = mock.Mock()
    kube.get_or_none.side_effect = pods.get
    suite = ChartSuite(kube, [], "localhost/composable-dra:x")
    assert suite.running("demo", "up")
    assert not suite.running("demo", "waiting")
    assert not suite.running("demo", "gone")
