"""The import contracts of pyproject.toml (`make lint` runs lint-imports): the repository
keeps them, and each one breaks on a deliberate violation, so the check is known to bite.

The violations are made in a tree of stub packages named like the real ones, checked
with the repository's own contracts."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
COMPONENTS = (
    "dra_driver",
    "device_scaler",
    "composable_operator",
    "pool_publisher",
    "remote_gpu",
    "fabric_emulator",
)


def _contracts_toml() -> str:
    """pyproject.toml's [tool.importlinter] tables, as they are written there."""
    kept: list[str] = []
    keep = False
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("["):
            keep = line.lstrip("[").startswith("tool.importlinter")
        if keep:
            kept.append(line)
    return "\n".join(kept) + "\n"


def _config() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads(_contracts_toml())["tool"]["importlinter"]
    return config


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(tree / "pyproject.toml")],
        cwd=tree,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _stub_tree(tmp_path: Path, importer: str = "", imported: str = "") -> Path:
    """Every root package as an empty stub; ``importer`` imports ``imported`` if given."""
    for package in _config()["root_packages"]:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    if importer:
        (tmp_path / importer / "bad.py").write_text(f"import {imported}\n")
    (tmp_path / "pyproject.toml").write_text(_contracts_toml())
    return tmp_path


def test_the_contracts_are_the_ones_pyproject_declares() -> None:
    whole = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert _config() == whole["tool"]["importlinter"]
    independent = [c for c in _config()["contracts"] if c["type"] == "independence"]
    assert [sorted(c["modules"]) for c in independent] == [sorted(COMPONENTS)]


def test_the_repository_keeps_its_contracts() -> None:
    run = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_tree_without_violations_keeps_them(tmp_path: Path) -> None:
    run = _lint(_stub_tree(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr


# contract -> imports that break it: (importer, imported)
VIOLATIONS: dict[str, list[tuple[str, str]]] = {
    "Components never import each other": [
        ("dra_driver", "device_scaler"),
        ("fabric_emulator", "remote_gpu"),
    ],
    "The shared library imports no component": [
        ("composable_dra", "composable_operator"),
        ("api", "pool_publisher"),
        ("composable_dra", "composable_dra_cli"),
    ],
    "No component imports the command line": [("remote_gpu", "composable_dra_cli")],
    "The product never imports the scripts, the test framework or the tests": [
        ("composable_dra", "hack"),
        ("dra_driver", "testbed"),
        ("device_scaler", "tests"),
    ],
}


@pytest.mark.parametrize(
    ("importer", "imported", "broken"),
    [(src, dst, contract) for contract, pairs in VIOLATIONS.items() for src, dst in pairs],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, importer: str, imported: str, broken: str
) -> None:
    run = _lint(_stub_tree(tmp_path, importer, imported))
    assert run.returncode == 1, run.stdout + run.stderr
    broken_lines = [line for line in run.stdout.splitlines() if line.endswith(" BROKEN")]
    assert len(broken_lines) == 1 and broken_lines[0].startswith(broken), run.stdout
    assert f"{importer}.bad -> {imported}" in run.stdout
