"""A clone with nothing beside it passes `make test`: no tracked file reaches outside the
repository for data (the Redfish schemas and registries live in tests/data/redfish)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Built from parts so that this file does not match itself.
OUTSIDE = (
    "../" + "shared",
    "shared/" + "redfish",
    '/ "' + 'shared"',
    "COMPOSABLE_DRA_" + "SHARED_DIR",
)


def test_no_tracked_file_refers_outside_the_repository() -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    offenders = []
    for name in filter(None, files):
        path = ROOT / name.decode()
        if not path.is_file() or path.suffix in {".xml", ".json"}:
            continue
        text = path.read_text(errors="replace")
        offenders += [f"{name.decode()}: {o}" for o in OUTSIDE if o in text]
    assert offenders == []


def test_redfish_reference_data_is_carried() -> None:
    data = ROOT / "tests" / "data" / "redfish"
    assert (data / "LICENSE.md").read_text().startswith("BSD 3-Clause License")
    assert (data / "csdl" / "ResourceBlock_v1.xml").is_file()
    assert (data / "registries" / "Composition.1.1.3.json").is_file()
