"""The chart's Grafana dashboard and alert rules (deploy/helm/composable-dra/dashboards,
rules): off by default, labelled for Grafana's sidecar, every metric they name documented,
and the rules checked and tested by promtool (built by hack/promtool.sh when missing,
never skipped). tests/e2e/test_monitoring.py checks the same names against the metrics
the running components export, and finds data for every panel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import chart, monitoring
from testbed.monitoring import Query, metric_names
from tests.unit.test_metrics_doc import metrics_in_doc

RULES_FILE = chart.CHART / "rules" / "alerts.yaml"
RULES_TEST = chart.ROOT / "deploy" / "helm" / "tests" / "alerts_test.yaml"
# The families every process exports besides docs/metrics.md's (the Python client's own).
CLIENT_DEFAULTS = ("process_", "python_gc_", "python_info")


@pytest.fixture(scope="module")
def rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    return monitoring.rendered()


@pytest.fixture(scope="module")
def queries(rendered: tuple[dict[str, Any], dict[str, Any]]) -> list[Query]:
    dashboard, rules = rendered
    return monitoring.panel_queries(dashboard) + monitoring.rule_queries(rules)


def test_metric_names_come_from_every_selector_and_nothing_else() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{x="rate(b)"}[5m])))'
        " / on (job) group_left topk(3, -c) > bool 0"
        ' or max_over_time({__name__="d_total", y!="z"}[10m:1m]) unless absent(e offset 5m)'
        ' and label_replace(f, "dst", "$1", "src", "(.*)")'
    )
    assert metric_names(expr) == {"a_seconds_bucket", "c", "d_total", "e", "f"}
    assert metric_names("sum(rate(x[$__rate_interval]))".replace("$__rate_interval", "1m")) == {"x"}
    with pytest.raises(ValueError, match="no metric name"):
        metric_names('{job="a"}')


def test_series_names_map_to_their_family() -> None:
    families = {"a_seconds", "b_total"}
    assert monitoring.family("a_seconds_bucket", families) == "a_seconds"
    assert monitoring.family("a_seconds_count", families) == "a_seconds"
    assert monitoring.family("b_total", families) == "b_total"
    assert monitoring.family("a_seconds_bogus", families) is None


def test_dashboard_and_rules_are_off_by_default_and_labelled_when_on() -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in chart.render()}
    assert not {k for k in kinds if k[0] == "PrometheusRule" or k[1].endswith("-dashboard")}
    objs = chart.render(
        values={
            "grafanaDashboard": {"enabled": True, "namespace": "monitoring"},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        }
    )
    [cm] = [o for o in objs if o["metadata"]["name"].endswith("-dashboard")]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    [rule] = [o for o in objs if o["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prometheus"


def test_every_panel_and_alert_names_documented_metrics_only(queries: list[Query]) -> None:
    documented = {name for name, _, _ in metrics_in_doc()}
    assert len(queries) > 20
    unknown = {
        (q.where, name)
        for q in queries
        for name in metric_names(q.expr)
        if monitoring.family(name, documented) is None and not name.startswith(CLIENT_DEFAULTS)
    }
    assert not unknown, f"not in docs/metrics.md: {sorted(unknown)}"


def test_the_alerts_are_the_ones_a_gpu_team_pages_on(
    rendered: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, rules = rendered
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert alerts == {
        "ComposableDRAFabricUnreachable",
        "ComposableDRAAttachesFailing",
        "ComposableDRAResourceStuck",
        "ComposableDRAPoolExhausted",
        "ComposableDRALeaderLost",
        "ComposableDRADonorLinkAtKnee",
        "ComposableDRAGPUFailed",
    }
    # The chart ships the file promtool tests, as it is.
    assert rules == yaml.safe_load(RULES_FILE.read_text())


def test_promtool_checks_the_rendered_rules(
    rendered: tuple[dict[str, Any], dict[str, Any]], tmp_path: Path
) -> None:
    _, rules = rendered
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    out = monitoring.promtool("check", "rules", tmp_path / "rules.yaml")
    assert "SUCCESS: 7 rules found" in out


def test_promtool_rule_tests_pass_with_a_firing_and_a_quiet_case_per_alert() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    cases = [c for t in tests for c in t["alert_rule_test"]]
    alerts = {
        r["alert"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]
    }
    for alert in alerts:
        outcomes = {bool(c["exp_alerts"]) for c in cases if c["alertname"] == alert}
        assert outcomes == {True, False}, f"{alert}: needs a test that fires and one that does not"
    monitoring.promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)


FIRST = """# TYPE a_total counter
a_total{path="x\\\\\\"y"} 1.0
# TYPE g gauge
g NaN
"""
SECOND = """# TYPE a_total counter
a_total{path="x\\\\\\"y"} 3.0
# TYPE g gauge
g 2.0
# TYPE late gauge
late 1.0
"""


def test_scrapes_become_promtool_series_one_step_a_scrape() -> None:
    series = monitoring.input_series({"op": [FIRST, SECOND]})
    assert series == [
        {"series": 'a_total{instance="op", job="op", path="x\\\\\\"y"}', "values": "1.0 3.0"},
        {"series": 'g{instance="op", job="op"}', "values": "_ 2.0"},
        {"series": 'late{instance="op", job="op"}', "values": "_ 1.0"},
    ]
    assert monitoring.series_names({"op": [FIRST, SECOND]}) == {"a_total", "g", "late"}
    assert monitoring.total(SECOND, "a_total") == 3


def test_the_finds_data_check_fails_a_query_with_no_data(tmp_path: Path) -> None:
    scrapes = {"op": [FIRST, SECOND]}
    found = [Query("rate", "sum by (path) (rate(a_total[5m]))"), Query("late", "late")]
    tests = tmp_path / "t.yaml"
    tests.write_text(yaml.safe_dump(monitoring.finds_data_tests(found, scrapes)))
    monitoring.promtool("test", "rules", tests.name, cwd=tmp_path)
    empty = [Query("none", 'a_total{path="other"}')]
    tests.write_text(yaml.safe_dump(monitoring.finds_data_tests(empty, scrapes)))
    with pytest.raises(monitoring.PromtoolError, match="a_total"):
        monitoring.promtool("test", "rules", tests.name, cwd=tmp_path)
