"""docs/metrics.md lists exactly the Prometheus metrics the code defines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [
    "composable_dra",
    "dra_driver",
    "pool_publisher",
    "device_scaler",
    "composable_operator",
    "fabric_emulator",
    "remote_gpu",
    "api",
]
TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}
Metric = tuple[str, str, tuple[str, ...]]


def _strings(node: ast.expr | None) -> tuple[str, ...]:
    if isinstance(node, ast.List | ast.Tuple):
        return tuple(
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        )
    return ()


def metrics_in_code() -> set[Metric]:
    """(exported name, type, labels) of every prometheus_client metric built in the packages."""
    found: set[Metric] = set()
    for package in PACKAGES:
        for source in (ROOT / package).rglob("*.py"):
            tree = ast.parse(source.read_text(), str(source))
            imported = {
                alias.asname or alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client"
                for alias in node.names
                if alias.name in TYPES
            }
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                    continue
                if node.func.id not in imported:
                    continue
                first = node.args[0] if node.args else None
                assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
                    f"{source}:{node.lineno}: metric names must be literals to be documented"
                )
                kind = TYPES[node.func.id]
                labels_arg = node.args[2] if len(node.args) > 2 else None
                for kw in node.keywords:
                    if kw.arg == "labelnames":
                        labels_arg = kw.value
                name = first.value
                if kind == "counter" and not name.endswith("_total"):
                    name += "_total"
                found.add((name, kind, _strings(labels_arg)))
    return found


def metrics_in_doc() -> set[Metric]:
    rows: set[Metric] = set()
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        name, kind, labels, meaning = cells
        assert meaning, f"{name}: no meaning"
        rows.add((name.strip("`"), kind, tuple(re.findall(r"`([^`]+)`", labels))))
    return rows


def test_code_defines_metrics() -> None:
    code = metrics_in_code()
    assert ("composable_dra_attach_seconds", "histogram", ("fabric",)) in code
    assert ("remote_gpu_leases_opened_total", "counter", ("transport",)) in code


def test_doc_lists_exactly_the_metrics_in_the_code() -> None:
    code, doc = metrics_in_code(), metrics_in_doc()
    missing = sorted(code - doc)
    stale = sorted(doc - code)
    assert not missing and not stale, (
        f"docs/metrics.md is out of date.\nmissing or different: {missing}\n"
        f"not in the code: {stale}"
    )
