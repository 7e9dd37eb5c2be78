"""hack/device/gpu-check.sh where there is no GPU: it refuses at once, with its own exit
code and a JSON line, and installs nothing. (Its GPU path runs only on a GPU machine.)"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "hack" / "device" / "gpu-check.sh"
NO_GPU, USAGE = 77, 2


def run(
    tmp_path: Path, *args: str, nvidia_smi: str, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """The script with ``nvidia_smi`` (a shell body) first on PATH as nvidia-smi, and
    ``extra`` passed on to gpu_check.py."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\n{nvidia_smi}\n")
    fake.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "PYTHON": sys.executable,
        "GPU_CHECK_VENV": str(tmp_path / "venv"),
        "HOME": str(tmp_path),
    }
    return subprocess.run(
        ["/bin/bash", str(SCRIPT), *args, *(("--", *extra) if extra else ())],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    "nvidia_smi",
    [
        "echo 'NVIDIA-SMI has failed because it could not communicate with the driver'; exit 9",
        "echo 'No devices were found'; exit 6",
        "exit 0",
    ],
)
def test_without_a_gpu_it_refuses_with_exit_77_and_installs_nothing(
    tmp_path: Path, nvidia_smi: str
) -> None:
    done = run(tmp_path, "--wheelhouse", str(tmp_path), nvidia_smi=nvidia_smi)
    assert done.returncode == NO_GPU, done.stderr
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["ok"] is False and "no NVIDIA GPU" in line["error"]
    assert "run it where one is" in done.stderr
    assert not (tmp_path / "venv").exists()


def test_bad_usage_is_exit_2(tmp_path: Path) -> None:
    assert run(tmp_path, "--bogus", nvidia_smi="exit 9").returncode == USAGE


def test_requirements_are_the_projects_and_its_gpu_extras(tmp_path: Path) -> None:
    done = run(tmp_path, "--requirements", nvidia_smi="exit 9")
    assert done.returncode == 0, done.stderr
    reqs = done.stdout.split()
    assert {"numpy>=1.26", "cupy-cuda12x>=13", "torch>=2.4", "kubernetes>=37"} <= set(reqs)
    without = run(tmp_path, "--requirements", "--no-gpu-extras", nvidia_smi="exit 9")
    assert not {"cupy-cuda12x>=13", "torch>=2.4"} & set(without.stdout.split())


def check(*args: str) -> tuple[int, dict[str, Any]]:
    """hack/device/gpu_check.py as the shell script runs it: its exit code and JSON line."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "gpu_check.py"), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    out: dict[str, Any] = json.loads(lines[-1])
    return done.returncode, out


def test_its_python_part_runs_the_workload_and_figures_against_a_donor() -> None:
    """The same plumbing with the numpy backend: a donor process, the workload against it,
    a product through it (the GPU figures need a GPU)."""
    code, out = check("--backends", "numpy", "--size", "128", "--reps", "1")
    numpy = out["backends"]["numpy"]
    assert code == 0 and out["ok"] is True and numpy["products_correct"] is True, out
    assert numpy["workload"]["ok"] is True and numpy["workload"]["calls"] == 4
    assert numpy["remote_bytes_per_s_128"] > 0 and out["numpy_matmul_s_128"] > 0


def test_a_donor_that_refuses_its_backend_is_reported() -> None:
    code, out = check("--backends", "cupy", "--size", "64", "--reps", "1")
    assert code == 1 and out["backends"]["cupy"]["ok"] is False
    assert "cupy" in out["backends"]["cupy"]["error"]


def test_its_python_part_needs_no_dev_extra() -> None:
    """The GPU machine gets the project's dependencies and the GPU extras, not ``dev``:
    nothing from the test framework (testbed needs cryptography) or the tests."""
    tree = ast.parse((SCRIPT.parent / "gpu_check.py").read_text())
    imported = {
        name.split(".")[0]
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    }
    assert not imported & {"testbed", "tests", "hack", "pytest", "cryptography"}


def test_where_nvidia_smi_lists_a_gpu_it_installs_from_the_wheelhouse_and_runs(
    tmp_path: Path,
) -> None:
    """The whole script, as far as a machine without a GPU goes: nvidia-smi (a stand-in)
    lists one, the environment is made from this test's own virtual environment (whose
    packages the new one sees, as on the GPU image), pip finds everything installed (an
    empty wheelhouse: no network), and the numpy backend runs."""
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    done = run(
        tmp_path,
        "--wheelhouse",
        str(wheelhouse),
        "--backends",
        "numpy",
        nvidia_smi="echo 'GPU 0: Stand-in (UUID: GPU-0)'",
        extra=("--size", "64", "--reps", "1"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ok"] is True and out["backends"]["numpy"]["products_correct"] is True
    assert (tmp_path / "venv" / "gpu-check-requirements.txt").read_text().split()[-1] == (
        "numpy>=1.26"
    )


def test_a_python_without_ensurepip_still_gets_an_environment_with_pip(tmp_path: Path) -> None:
    """Ubuntu's python3 lacks ensurepip unless python3-venv is installed: the environment
    is made without pip, and the outer environment's pip installs into it."""
    fake = tmp_path / "no-ensurepip"
    fake.mkdir()
    (fake / "ensurepip.py").write_text("raise ImportError('no ensurepip here')\n")
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={fake} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: Stand-in (UUID: GPU-0)'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    done = subprocess.run(
        ["/bin/bash", str(SCRIPT), "--wheelhouse", str(wheelhouse), "--backends", "numpy",
         "--", "--size", "64", "--reps", "1"],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON": str(wrapper),
             "GPU_CHECK_VENV": str(tmp_path / "venv"), "HOME": str(tmp_path)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list((tmp_path / "venv").glob("lib/python*/site-packages/pip"))
    assert json.loads(done.stdout.strip().splitlines()[-1])["ok"] is True
