"""The support matrix check (hack/support_matrix.py), and the matrix of docs/operations.md:
each cell's tests exist and are in that release's run (testbed/versions.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hack import support_matrix as sm
from testbed import versions

ROOT = Path(__file__).resolve().parents[3]
DOC = """
### Support matrix

| feature | v1.35.8 | v1.36.5 |
|---|---|---|
| attach | ✗ gate: `test_a.py::test_no` | ✓ `test_a.py::test_one`, `test_b.py::test_p` |
| health | ✗ no test | ✓ |

## Next section
| not | the | matrix |
"""


def junit(*cases: tuple[str, str, str]) -> str:
    """JUnit XML as pytest writes it: (module, name, outcome)."""
    body = {
        "passed": "",
        "skipped": '<skipped type="pytest.skip" message="no"/>',
        "failed": '<failure message="boom"/>',
    }
    rows = "".join(
        f'<testcase classname="tests.e2e.{m}" name="{n}" time="1">{body[o]}</testcase>'
        for m, n, o in cases
    )
    return (
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{rows}</testsuite></testsuites>'
    )


def test_the_matrix_is_read_cell_by_cell() -> None:
    cells = sm.parse_matrix(DOC)
    assert [(c.feature, c.release, c.yes, c.tests) for c in cells] == [
        ("attach", "v1.35.8", False, ("test_a.py::test_no",)),
        ("attach", "v1.36.5", True, ("test_a.py::test_one", "test_b.py::test_p")),
        ("health", "v1.35.8", False, ()),
        ("health", "v1.36.5", True, ()),
    ]


@pytest.mark.parametrize(
    "doc",
    ["no matrix", "### Support matrix\n\n| a | b |\n|---|---|\n", DOC.replace("v1.35.8", "old")],
)
def test_a_missing_or_malformed_matrix_is_refused(doc: str) -> None:
    with pytest.raises(ValueError):
        sm.parse_matrix(doc)


def test_junit_outcomes_by_test_every_case_of_a_parametrized_one() -> None:
    xml = junit(
        ("test_b", "test_p[x]", "passed"),
        ("test_b", "test_p[y]", "failed"),
        ("test_a", "s", "skipped"),
    )
    assert sm.parse_junit(xml) == {
        "test_b.py::test_p": ["passed", "failed"],
        "test_a.py::s": ["skipped"],
    }


def test_every_named_test_must_have_passed_on_its_release_and_nothing_skipped() -> None:
    cells = sm.parse_matrix(DOC)
    good = {
        "v1.35.8": sm.parse_junit(junit(("test_a", "test_no", "passed"))),
        "v1.36.5": sm.parse_junit(
            junit(("test_a", "test_one", "passed"), ("test_b", "test_p[x]", "passed"))
        ),
    }
    # The one problem left: the ✓ of health names no test.
    assert sm.problems(cells, good) == ["health on v1.36.5: a ✓ names no test"]
    bad = {
        "v1.35.8": sm.parse_junit(
            junit(("test_a", "test_no", "failed"), ("test_c", "other", "skipped"))
        ),
        "v1.36.5": sm.parse_junit(
            junit(("test_a", "test_one", "passed"), ("test_b", "test_p[x]", "skipped"))
        ),
    }
    assert sm.problems(cells, bad) == [
        "v1.35.8: skipped test_c.py::other",
        "v1.36.5: skipped test_b.py::test_p",
        "attach on v1.35.8: test_a.py::test_no failed",
        "attach on v1.36.5: test_b.py::test_p skipped",
        "health on v1.36.5: a ✓ names no test",
    ]
    assert sm.problems(cells, {"v1.35.8": good["v1.35.8"]})[0] == "v1.36.5: no test results"
    ran_not = {**good, "v1.36.5": sm.parse_junit(junit(("test_a", "test_one", "passed")))}
    assert "attach on v1.36.5: test_b.py::test_p did not run" in sm.problems(cells, ran_not)


def test_main_reads_a_directory_of_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "ops.md"
    doc.write_text(DOC.replace("| ✓ |", "| ✓ `test_a.py::test_one` |"))
    (tmp_path / "v1.35.8.xml").write_text(junit(("test_a", "test_no", "passed")))
    (tmp_path / "v1.36.5.xml").write_text(
        junit(("test_a", "test_one", "passed"), ("test_b", "test_p", "passed"))
    )
    assert sm.main([str(tmp_path), str(doc)]) == 0
    assert '"problems": 0' in capsys.readouterr().out
    (tmp_path / "v1.36.5.xml").write_text(junit(("test_a", "test_one", "skipped")))
    assert sm.main([str(tmp_path), str(doc)]) == 1


def _marker(test_file: Path, name: str) -> tuple[tuple[str, ...] | None, bool] | None:
    """The ``versions`` marker of ``name`` in ``test_file`` (its own or the module's
    ``pytestmark``): (minors, default); (None, True) unmarked; None when not defined."""
    tree = ast.parse(test_file.read_text())
    found: tuple[tuple[str, ...] | None, bool] | None = None
    marks: list[ast.expr] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            marks += node.value.elts if isinstance(node.value, ast.List) else [node.value]
        if isinstance(node, ast.FunctionDef) and node.name == name:
            found = (None, True)
            marks += node.decorator_list
    if found is None:
        return None
    for mark in marks:
        if (
            isinstance(mark, ast.Call)
            and isinstance(mark.func, ast.Attribute)
            and mark.func.attr == versions.MARKER
        ):
            minors = tuple(str(ast.literal_eval(a)) for a in mark.args)
            default = all(ast.literal_eval(k.value) for k in mark.keywords if k.arg == "default")
            return minors, default
    return found


def test_each_test_the_docs_matrix_names_exists_and_runs_on_that_release() -> None:
    cells = sm.parse_matrix((ROOT / "docs/operations.md").read_text())
    releases = {c.release for c in cells}
    from testbed.controlplane import RELEASES

    assert releases == {versions.default_release(), *RELEASES.values()}
    assert all(c.tests for c in cells if c.yes)
    for cell in cells:
        for test in cell.tests:
            test_file, name = test.split("::")
            marker = _marker(ROOT / "tests/e2e" / test_file, name)
            assert marker is not None, f"{cell.feature} on {cell.release}: no {test}"
            assert versions.runs_on(marker[0], marker[1], cell.release), (
                f"{cell.feature} on {cell.release}: {test} is not in that release's run"
            )
