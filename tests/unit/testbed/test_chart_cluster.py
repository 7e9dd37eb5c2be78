"""testbed.chart_cluster: the fabric hosts the nodes stand for, metric sums, and
ChartSuite's reads of pods (the demo's --chart cluster)."""

from __future__ import annotations

from typing import Any
from unittest import mock

from fabric_emulator.topology import host_uuid
from testbed.chart_cluster import ChartSuite, fabric_gpus, host_uuids, total


def test_the_nodes_stand_for_the_emulator_hosts() -> None:
    assert host_uuids(["node-2", "node-1"]) == [host_uuid("node-2"), host_uuid("node-1")]
    # As the plugin publishes them: no GPU- prefix.
    gpus = fabric_gpus()
    assert len(gpus) == 8 and not [g for g in gpus if g.startswith("GPU-")]


def test_a_total_sums_every_label_set_of_one_name() -> None:
    samples = {
        ("ops_total", (("operation", "attach"),)): 2.0,
        ("ops_total", (("operation", "detach"),)): 1.0,
        ("other", ()): 5.0,
    }
    assert total(samples, "ops_total") == 3.0
    assert total(samples, "missing") == 0


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
