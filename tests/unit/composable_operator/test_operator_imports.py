"""The operator's modules import each other one way only, and its kopf handlers reach the
Controller through a few parts, not its fields (docs/architecture.md, issue 26 item 3).

Read from the code (every import, TYPE_CHECKING and function-level ones included), so
that a cycle or a handler reaching into the Controller's state cannot come back unseen.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import composable_operator

PACKAGE = "composable_operator"
ROOT = Path(composable_operator.__file__).parent


def imported(tree: ast.AST, package: str) -> set[str]:
    """The modules of ``package`` that a module's code imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            # ``from package import a, b`` imports modules a and b.
            base = node.module
            names = [f"{base}.{a.name}" for a in node.names] if base == package else [base]
        else:
            continue
        out |= {n for n in names if n.startswith(package + ".")}
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of the package, with the modules of the package it imports."""
    graph: dict[str, set[str]] = {}
    for file in sorted(root.glob("*.py")):
        module = f"{package}.{file.stem}"
        graph[module] = imported(ast.parse(file.read_text()), package) - {module}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of the graph, or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        found: list[str] = exc.args[1]
        return found
    return None


def test_the_operators_modules_import_each_other_one_way() -> None:
    graph = import_graph(ROOT, PACKAGE)
    assert f"{PACKAGE}.picks" in graph and f"{PACKAGE}.controller" in graph
    assert cycle(graph) is None


def test_a_deliberate_cycle_is_found(tmp_path: Path) -> None:
    # What picks.py and controller.py once did: each imports the other, one of them
    # only for its types.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("from pkg.b import B\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
    )
    (pkg / "c.py").write_text("def f():\n    from pkg import a\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.a"}}
    found = cycle(graph)
    assert found is not None and set(found) == {"pkg.a", "pkg.b"}


def reached(tree: ast.AST, name: str) -> set[str]:
    """The attributes of the variable ``name`` that the code reads or calls."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
    }


@pytest.mark.parametrize(
    ("code", "attrs"),
    [("ctl.detacher.run()", {"detacher"}), ("ctl.a; ctl.b.c; other.d", {"a", "b"})],
)
def test_reached_attributes(code: str, attrs: set[str]) -> None:
    assert reached(ast.parse(code), "ctl") == attrs


def test_the_handlers_reach_the_controller_through_a_few_parts() -> None:
    # The index wakes daemons (resource_events), the deletion handler detaches (the
    # Detacher); the attach daemon takes the Controller whole.
    tree = ast.parse((ROOT / "handlers.py").read_text())
    assert reached(tree, "ctl") <= {"resource_events", "detacher"}
