"""The chart's Grafana dashboard and alert rules as the tests read them: their PromQL
expressions, the metric names those name (parsed with promql-parser), and promtool.

Grafana's own variables are given the values Grafana would (``$__rate_interval`` is a
range of at least four scrape intervals), so that an expression parses and evaluates
outside Grafana.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

from testbed import chart

# Grafana's variables, as the dashboard uses them, and a value each can take.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
# The suffixes prometheus_client adds to a histogram's (and a counter's) family name.
SERIES_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


@dataclass(frozen=True)
class Query:
    """One expression: where it is (a panel's title and refId, or an alert's name)."""

    where: str
    expr: str


class PromtoolError(RuntimeError):
    pass


def rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    """The dashboard (parsed JSON) and the PrometheusRule's spec, from the chart as
    rendered with both turned on."""
    objs = chart.render(
        values={"grafanaDashboard": {"enabled": True}, "prometheusRule": {"enabled": True}}
    )
    [cm] = [
        o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
    ]
    [rule] = [o for o in objs if o["kind"] == "PrometheusRule"]
    [text] = cm["data"].values()
    return json.loads(text), rule["spec"]


def grafana_free(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    return expr


def panel_queries(dashboard: dict[str, Any]) -> list[Query]:
    """Every target of every panel (rows' nested panels too), Grafana variables filled in."""
    out: list[Query] = []
    panels = list(dashboard.get("panels") or [])
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels") or [])
        for target in panel.get("targets") or []:
            where = f"panel {panel['title']!r} {target['refId']}"
            out.append(Query(where, grafana_free(target["expr"])))
    return out


def rule_queries(spec: dict[str, Any]) -> list[Query]:
    return [
        Query(f"alert {r.get('alert') or r.get('record')}", str(r["expr"]))
        for group in spec["groups"]
        for r in group["rules"]
    ]


def _children(node: Any) -> list[Any]:
    """The sub-expressions of one promql-parser node."""
    if isinstance(node, promql_parser.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, promql_parser.Call):
        return list(node.args)
    if isinstance(node, promql_parser.AggregateExpr):
        return [node.expr] + ([node.param] if node.param is not None else [])
    if isinstance(node, promql_parser.MatrixSelector):
        return [node.vector_selector]
    if isinstance(
        node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr
    ):
        return [node.expr]
    return []


def _selector_name(node: promql_parser.VectorSelector) -> str:
    if node.name:
        return str(node.name)
    for m in node.matchers.matchers:
        if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal:
            return str(m.value)
    raise ValueError(f"a selector with no metric name: {node.prettify()}")


def metric_names(expr: str) -> set[str]:
    """The metric names every selector of ``expr`` reads (ValueError: one it cannot name)."""
    names: set[str] = set()
    todo = [promql_parser.parse(expr)]
    while todo:
        node = todo.pop()
        if isinstance(node, promql_parser.VectorSelector):
            names.add(_selector_name(node))
        todo.extend(_children(node))
    return names


def family(series: str, families: set[str]) -> str | None:
    """The family among ``families`` that a series name belongs to (``x_bucket`` -> ``x``)."""
    if series in families:
        return series
    for suffix in SERIES_SUFFIXES:
        if series.endswith(suffix) and (base := series.removesuffix(suffix)) in families:
            return base
    return None


@functools.cache
def promtool_binary() -> Path:
    """Build promtool from source when it is missing (minutes, once per machine); its path."""
    script = chart.ROOT / "hack" / "promtool.sh"
    out = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise PromtoolError(f"{script} failed (exit {out.returncode}); see its output")
    return Path(out.stdout.strip().splitlines()[-1])


def promtool(*args: str | Path, cwd: Path | None = None) -> str:
    """Run promtool; its output, or PromtoolError with it."""
    out = subprocess.run(
        [str(promtool_binary()), *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )
    if out.returncode != 0:
        raise PromtoolError(
            f"promtool {' '.join(map(str, args))} failed:\n{out.stdout}{out.stderr}"
        )
    return out.stdout + out.stderr


# -- scraped samples as promtool input ------------------------------------------------------


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def samples(text: str, instance: str) -> dict[str, float]:
    """One scrape (Prometheus text format) as series -> value, each series labelled with
    ``instance`` and ``job`` as Prometheus labels its targets' samples."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = {**s.labels, "instance": instance, "job": instance}
            body = ", ".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
            out[f"{s.name}{{{body}}}"] = float(s.value)
    return out


def series_names(scrapes: dict[str, list[str]]) -> set[str]:
    """Every series name the scrapes hold a sample of."""
    return {
        series.split("{", 1)[0]
        for instance, texts in scrapes.items()
        for text in texts
        for series in samples(text, instance)
    }


def input_series(scrapes: dict[str, list[str]]) -> list[dict[str, str]]:
    """promtool's input_series: each instance's scrapes as consecutive steps (one a
    step); a series missing from a scrape, or NaN there, is ``_`` at that step."""
    steps = max(len(texts) for texts in scrapes.values())
    values: dict[str, list[str]] = {}
    for instance, texts in scrapes.items():
        for i, text in enumerate(texts):
            for series, v in samples(text, instance).items():
                row = values.setdefault(series, ["_"] * steps)
                row[i] = "_" if math.isnan(v) else repr(v)
    return [{"series": s, "values": " ".join(v)} for s, v in sorted(values.items())]


def finds_data_tests(queries: list[Query], scrapes: dict[str, list[str]]) -> dict[str, Any]:
    """A promtool rules test that asks of each query, at the last scrape, that it returns
    at least one sample (any value: a histogram_quantile of no new observations is NaN,
    which is still a panel that shows something)."""
    steps = max(len(texts) for texts in scrapes.values())
    return {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "every query finds data",
                "interval": "1m",
                "input_series": input_series(scrapes),
                "promql_expr_test": [
                    {
                        "expr": f"clamp_max(count({q.expr}), 1)",
                        "eval_time": f"{steps - 1}m",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                    for q in queries
                ],
            }
        ],
    }


def scrape(port: int) -> str:
    """One scrape of the /metrics a component serves on ``port`` of this machine."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` in one scrape (0: none), of those with
    ``labels`` where given."""
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
