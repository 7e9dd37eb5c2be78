"""Where the test framework lives, held by the import graph (docs/architecture.md, Tests).

The local test cluster is the ``testbed`` package: the tests, the benchmarks and the
demo import it; it imports the product only. ``hack/`` holds scripts people run, so a
test imports from it only the scripts it tests (the benchmarks, the simulator). Read
from the code with ``ast``, so that the rule cannot drift from the doc.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.unit.test_architecture_rules import PRODUCT

ROOT = Path(__file__).resolve().parents[3]
# Spelled in two parts so that the import rewrite (testbed's move) leaves it alone.
OLD = "hack" + ".localcluster"
# hack's scripts whose parts the tests exercise; anything else under hack/ is not a library.
HACK_SCRIPTS = ("hack.bench", "hack.sim", "hack.support_matrix")


def imported(source: str) -> Iterator[str]:
    """Every absolute module name ``source`` imports, at any depth of the file."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def broken_rule(top: str, name: str) -> str | None:
    """Why a module in the top-level directory ``top`` may not import ``name``, or None."""
    if _under(name, OLD):
        return f"{OLD} is gone: the test framework is testbed"
    if top in PRODUCT and any(_under(name, p) for p in ("testbed", "hack", "tests")):
        return "the product imports no test framework, script or test"
    if top == "testbed" and any(_under(name, p) for p in ("hack", "tests")):
        return "testbed imports the product only, never hack or the tests"
    if (
        top == "tests"
        and _under(name, "hack")
        and name != "hack"
        and not any(_under(name, s) for s in HACK_SCRIPTS)
    ):
        return f"a test imports from hack only the scripts it tests ({', '.join(HACK_SCRIPTS)})"
    return None


def violations(root: Path) -> list[str]:
    found = []
    for top in (*PRODUCT, "testbed", "hack", "tests"):
        for file in sorted((root / top).rglob("*.py")):
            for name in set(imported(file.read_text())):
                if why := broken_rule(top, name):
                    found.append(f"{file.relative_to(root)} imports {name}: {why}")
    return sorted(found)


def test_the_repository_keeps_the_rules() -> None:
    assert violations(ROOT) == []
    assert not (ROOT / OLD.replace(".", "/")).exists()


def test_a_test_that_imports_the_old_framework_is_caught(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        f"def f():\n    from {OLD}.harness import Suite\n"
    )
    why = f"{OLD} is gone: the test framework is testbed"
    assert violations(tmp_path) == [
        f"tests/test_x.py imports {OLD}.harness.Suite: {why}",
        f"tests/test_x.py imports {OLD}.harness: {why}",
    ]


def test_each_direction_is_caught() -> None:
    assert broken_rule("testbed", "tests.e2e.conftest")
    assert broken_rule("testbed", "hack.bench.goals")
    assert broken_rule("dra_driver", "testbed.wait")
    assert broken_rule("tests", "hack.demo")
    assert broken_rule("tests", "hack.bench.goals") is None
    assert broken_rule("tests", "testbed.harness") is None
    assert broken_rule("hack", "testbed.harness") is None
