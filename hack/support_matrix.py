"""Checks docs/operations.md's support matrix against the test results of each release.

``make test`` runs the default release's tests and each older release's subset
(hack/versions-test.sh), each writing a JUnit XML file ``<release>.xml`` in one directory.
Each cell of the matrix names, in backticks, the tests that show it (``test_file.py::name``;
a parametrized test's every case). A cell of an older release may go on with what its
gates give: ``✗ off by default: `test_x.py::a`; ✓ with `--feature-gates=G=true`:
`test_y.py::b```: the tests after ``✓ with`` are checked against that release's gated run
(``<release>+gates.xml``, testbed/versions.py). This check fails when a cell's test did
not pass on that column's release (not run, failed, or skipped), when a ✓ names no test,
or when any run skipped anything.

    python -m hack.support_matrix build/junit docs/operations.md

Its last line is JSON: the releases, the cells and tests checked, the problems.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from junitparser import JUnitXml

from testbed.versions import GATED_SUFFIX

HEADING = "### Support matrix"
YES = "✓"
GATED = "✓ with "  # what follows in a cell holds on the release with its gates on
_TEST = re.compile(r"`(test_\w+\.py)::(\w+)`")
_RELEASE = re.compile(r"v1\.\d+\.\d+")


@dataclass(frozen=True)
class Cell:
    feature: str
    release: str
    yes: bool
    tests: tuple[str, ...]  # "test_file.py::name"


def parse_matrix(doc: str) -> list[Cell]:
    """The cells of the table under HEADING: a header row ``| feature | v1.35.8 | ...``,
    then a row per feature. ValueError when there is no such table."""
    if HEADING not in doc:
        raise ValueError(f"no {HEADING!r} section")
    rows = []
    for line in doc.split(HEADING, 1)[1].splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    if len(rows) < 3:
        raise ValueError("the support matrix has no rows")
    releases = rows[0][1:]
    if not releases or not all(_RELEASE.fullmatch(r) for r in releases):
        raise ValueError(f"the matrix's columns are not releases: {releases}")
    cells = []
    for row in rows[2:]:  # after the header and its |---| line
        for release, text in zip(releases, row[1:], strict=True):
            cells.extend(_cells(row[0], release, text))
    return cells


def _cells(feature: str, release: str, text: str) -> list[Cell]:
    """One cell's text: its release's cell, and its gated run's when it says ``✓ with``."""
    plain, gated = text, None
    at = text.find(GATED, 1)  # a cell that starts with it is the release's own ✓
    if at > 0:
        plain, gated = text[:at], text[at:]
    out = [Cell(feature, release, plain.startswith(YES), _tests(plain))]
    if gated is not None:
        out.append(Cell(feature, release + GATED_SUFFIX, True, _tests(gated)))
    return out


def _tests(text: str) -> tuple[str, ...]:
    return tuple(f"{f}::{n}" for f, n in _TEST.findall(text))


def parse_junit(text: str) -> dict[str, list[str]]:
    """``test_file.py::name`` -> the outcome of each of its cases (``passed``,
    ``skipped``, ``failed``), from pytest's JUnit XML."""
    out: dict[str, list[str]] = {}
    for suite in JUnitXml.fromstring(text):
        for case in suite:
            test_file = str(case.classname).rsplit(".", 1)[-1] + ".py"
            name = str(case.name).split("[", 1)[0]
            outcome = "passed" if case.is_passed else "skipped" if case.is_skipped else "failed"
            out.setdefault(f"{test_file}::{name}", []).append(outcome)
    return out


def problems(cells: list[Cell], results: Mapping[str, dict[str, list[str]]]) -> list[str]:
    """What is wrong: ``results`` maps each release to its run's ``parse_junit``."""
    out = []
    for release in sorted({c.release for c in cells} - set(results)):
        out.append(f"{release}: no test results")
    for release, run in sorted(results.items()):
        skipped = sorted(t for t, outcomes in run.items() if "skipped" in outcomes)
        if skipped:
            out.append(f"{release}: skipped {', '.join(skipped)}")
    for cell in cells:
        where = f"{cell.feature} on {cell.release}"
        if cell.yes and not cell.tests:
            out.append(f"{where}: a ✓ names no test")
        ran = results.get(cell.release)
        for test in cell.tests if ran is not None else ():
            outcomes = ran.get(test, []) if ran is not None else []
            if not outcomes or set(outcomes) != {"passed"}:
                out.append(f"{where}: {test} {', '.join(outcomes) or 'did not run'}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    junit_dir, doc = Path(argv[0]), Path(argv[1])
    cells = parse_matrix(doc.read_text())
    results = {p.stem: parse_junit(p.read_text()) for p in sorted(junit_dir.glob("v*.xml"))}
    found = problems(cells, results)
    for p in found:
        print(f"support matrix: {p}", file=sys.stderr)
    summary = {
        "releases": sorted(results),
        "cells": len(cells),
        "yes": sum(c.yes for c in cells),
        "tests_checked": sum(len(c.tests) for c in cells),
        "problems": len(found),
    }
    print(json.dumps(summary))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
