"""The support matrix check (hack/support_matrix.py), and the matrix of docs/operations.md:
each cell's tests exist and are in that release's run (testbed/versions.py)."""

from __future__ import annotations

import ast
import re
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


def write_runs(tmp_path: Path, doc_text: str) -> Path:
    """``doc_text`` (health's ✓ naming a test) and the passing plain runs, in ``tmp_path``:
    the doc's path."""
    doc = tmp_path / "ops.md"
    doc.write_text(doc_text.replace("| ✓ |", "| ✓ `test_a.py::test_one` |"))
    (tmp_path / "v1.35.8.xml").write_text(junit(("test_a", "test_no", "passed")))
    (tmp_path / "v1.36.5.xml").write_text(
        junit(("test_a", "test_one", "passed"), ("test_b", "test_p", "passed"))
    )
    return doc


def test_main_reads_a_directory_of_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = write_runs(tmp_path, DOC)
    assert sm.main([str(tmp_path), str(doc)]) == 0
    assert '"problems": 0' in capsys.readouterr().out
    (tmp_path / "v1.36.5.xml").write_text(junit(("test_a", "test_one", "skipped")))
    assert sm.main([str(tmp_path), str(doc)]) == 1


GATED_DOC = DOC.replace(
    "✗ gate: `test_a.py::test_no`",
    "✗ off by default: `test_a.py::test_no`; "
    "✓ with `--feature-gates=G=true`: `test_a.py::test_one`",
)


def test_a_cell_with_its_gates_on_is_a_cell_of_the_gated_run() -> None:
    cells = sm.parse_matrix(GATED_DOC)
    assert [(c.feature, c.release, c.yes, c.tests) for c in cells][:3] == [
        ("attach", "v1.35.8", False, ("test_a.py::test_no",)),
        ("attach", "v1.35.8+gates", True, ("test_a.py::test_one",)),
        ("attach", "v1.36.5", True, ("test_a.py::test_one", "test_b.py::test_p")),
    ]
    # A cell that is a ✓ of its own release is not split.
    own = sm.parse_matrix(DOC.replace("| ✓ |", "| ✓ with nothing to turn on: `test_a.py::x` |"))
    assert ("health", "v1.36.5", True, ("test_a.py::x",)) in [
        (c.feature, c.release, c.yes, c.tests) for c in own
    ]


def test_a_gated_test_must_have_passed_in_the_gated_run() -> None:
    cells = sm.parse_matrix(GATED_DOC.replace("| ✓ |", "| ✓ `test_a.py::test_one` |"))
    plain = {
        "v1.35.8": sm.parse_junit(junit(("test_a", "test_no", "passed"))),
        "v1.36.5": sm.parse_junit(
            junit(("test_a", "test_one", "passed"), ("test_b", "test_p", "passed"))
        ),
    }
    # Passing on v1.35.8 without its gates, or on v1.36.5, does not count.
    plain_too = {
        **plain,
        "v1.35.8": sm.parse_junit(
            junit(("test_a", "test_no", "passed"), ("test_a", "test_one", "passed"))
        ),
    }
    assert sm.problems(cells, plain_too) == ["v1.35.8+gates: no test results"]
    for outcome, said in [("failed", "failed"), ("skipped", "skipped")]:
        gated = {**plain, "v1.35.8+gates": sm.parse_junit(junit(("test_a", "test_one", outcome)))}
        assert f"attach on v1.35.8+gates: test_a.py::test_one {said}" in sm.problems(cells, gated)
    other = {**plain, "v1.35.8+gates": sm.parse_junit(junit(("test_a", "test_no", "passed")))}
    assert sm.problems(cells, other) == ["attach on v1.35.8+gates: test_a.py::test_one did not run"]
    good = {**plain, "v1.35.8+gates": sm.parse_junit(junit(("test_a", "test_one", "passed")))}
    assert sm.problems(cells, good) == []


def test_main_reads_the_gated_run_by_its_file_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = write_runs(tmp_path, GATED_DOC)
    assert sm.main([str(tmp_path), str(doc)]) == 1  # no gated run
    (tmp_path / "v1.35.8+gates.xml").write_text(junit(("test_a", "test_one", "passed")))
    assert sm.main([str(tmp_path), str(doc)]) == 0
    assert '"releases": ["v1.35.8", "v1.35.8+gates", "v1.36.5"]' in capsys.readouterr().out


Marker = tuple[tuple[str, ...] | None, bool, tuple[str, ...]]


def _marker(test_file: Path, name: str) -> Marker | None:
    """The ``versions`` marker of ``name`` in ``test_file`` (its own or the module's
    ``pytestmark``): (minors, default, gated); (None, True, ()) unmarked; None when not
    defined."""
    tree = ast.parse(test_file.read_text())
    found: Marker | None = None
    marks: list[ast.expr] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            marks += node.value.elts if isinstance(node.value, ast.List) else [node.value]
        if isinstance(node, ast.FunctionDef) and node.name == name:
            found = (None, True, ())
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
            kw = {k.arg: ast.literal_eval(k.value) for k in mark.keywords}
            return minors, bool(kw.get("default", True)), tuple(kw.get("gated", ()))
    return found


def test_each_test_the_docs_matrix_names_exists_and_runs_on_that_release() -> None:
    cells = sm.parse_matrix((ROOT / "docs/operations.md").read_text())
    releases = {c.release for c in cells}
    from testbed.controlplane import RELEASES

    gated = {f"{RELEASES[m]}{versions.GATED_SUFFIX}" for m in versions.GATED}
    assert releases == {versions.default_release(), *RELEASES.values(), *gated}
    assert all(c.tests for c in cells if c.yes)
    for cell in cells:
        for test in cell.tests:
            test_file, name = test.split("::")
            marker = _marker(ROOT / "tests/e2e" / test_file, name)
            assert marker is not None, f"{cell.feature} on {cell.release}: no {test}"
            assert versions.runs_on(*marker[:2], cell.release, marker[2]), (
                f"{cell.feature} on {cell.release}: {test} is not in that release's run"
            )


def test_the_gates_a_docs_cell_names_are_the_ones_its_gated_run_turns_on() -> None:
    doc = (ROOT / "docs/operations.md").read_text().split(sm.HEADING, 1)[1]
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in doc.split("\n#", 1)[0].splitlines()
        if line.startswith("|")
    ]
    named = {
        (release, gate)
        for row in rows[2:]
        for release, text in zip(rows[0][1:], row[1:], strict=True)
        for gates in re.findall(r"✓ with `--feature-gates=([^`]+)`", text)
        for gate in re.findall(r"(\w+)=true", gates)
    }
    assert named, "no cell names a gated run"
    for release, gate in named:
        assert versions.GATED[versions.minor(release)].get(gate) is True, (release, gate)
