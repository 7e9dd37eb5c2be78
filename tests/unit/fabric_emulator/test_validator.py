"""The DMTF Redfish Service Validator reports zero failures: pristine, after attaches and
after detaches. Schemas come from tests/data/redfish/csdl only (no internet)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from fabric_emulator.testing import EmulatorProcess

from .conftest import REDFISH_DATA, Client

# rf_service_validator's own main, less its Excel report: writing that (openpyxl cell
# styles) took 80 % of each run, and nothing here reads it (the HTML report is checked).
VALIDATOR = [
    sys.executable,
    "-c",
    "from redfish_service_validator import console_scripts, report\n"
    "report.xlsx_report = lambda *args: None\n"
    "console_scripts.main()\n",
]


def _validate(url: str, logdir: Path) -> None:
    csdl = REDFISH_DATA / "csdl"
    assert (csdl / "ResourceBlock_v1.xml").is_file(), f"no CSDL schemas in {csdl}"
    proc = subprocess.run(
        [
            *VALIDATOR,
            "--ip",
            url,
            "-u",
            "admin",
            "-p",
            "admin",
            "--schema_directory",
            str(csdl),
            "--logdir",
            str(logdir),
            "--skipschema",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    # the summary table: | PASS | WARN | FAIL | NOT TESTED | then the numbers
    table = re.search(
        r"PASS\s*\|\s*WARN\s*\|\s*FAIL\s*\|\s*NOT TESTED\s*\|\s*\n\+[-+]+\+\s*\n"
        r"\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|",
        out,
    )
    assert table is not None, out[-4000:]
    passed, _warn, failed, _untested = (int(x) for x in table.groups())
    assert failed == 0, out[-8000:]
    assert passed > 500, out[-4000:]
    assert "Fail: " in out and not re.search(r"Fail: [1-9]", out), out[-8000:]
    reports = list(logdir.glob("*/RedfishServiceValidatorReport_*.html"))
    assert reports, f"no report in {logdir}"
    assert proc.returncode == 0, out[-8000:]


def test_validator_pristine_after_attaches_and_after_detaches(tmp_path: Path) -> None:
    with EmulatorProcess() as emu:
        _validate(emu.url, tmp_path / "pristine")
        c = Client(emu.url)
        for host, block in [
            ("node-1", "gpu-1"),
            ("node-1", "gpu-2"),
            ("node-2", "gpu-5"),
            ("node-2", "gpu-6"),
            ("node-3", "gpu-8"),
        ]:
            assert c.attach(host, block).status_code == 200
        emu.configure(async_polls=1)
        pending = c.attach("node-3", "gpu-7")  # leaves a task and a Composing block
        assert pending.status_code == 202
        _validate(emu.url, tmp_path / "attached")
        emu.configure(async_polls=0)
        for host, block in [("node-1", "gpu-1"), ("node-2", "gpu-6"), ("node-3", "gpu-8")]:
            assert c.detach(host, block).status_code == 200
        _validate(emu.url, tmp_path / "detached")
