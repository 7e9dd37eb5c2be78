"""Render the Helm chart (deploy/helm/composable-dra) with a helm built by hack/helm.sh."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "composable-dra"
# The Kubernetes version the chart is rendered for: the one the tests run.
KUBE_VERSION = "1.37.1"


class HelmError(RuntimeError):
    pass


@functools.cache
def helm_binary() -> Path:
    """Build helm from source when it is missing (minutes, once per machine); its path."""
    script = ROOT / "hack" / "helm.sh"
    out = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise HelmError(f"{script} failed (exit {out.returncode}); see its output")
    return Path(out.stdout.strip().splitlines()[-1])


def helm(*args: str) -> str:
    """Run helm; its stdout, or HelmError with its stderr."""
    out = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, check=False, cwd=ROOT
    )
    if out.returncode != 0:
        raise HelmError(f"helm {' '.join(args)} failed:\n{out.stderr}")
    return out.stdout


def render(
    release: str = "cdra",
    namespace: str = "composable-dra",
    values_files: Sequence[Path] = (),
    values: dict[str, Any] | None = None,
    include_crds: bool = False,
) -> list[dict[str, Any]]:
    """`helm template` of the chart, as a list of objects."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    args += ["--kube-version", KUBE_VERSION]
    for f in values_files:
        args += ["--values", str(f)]
    for key, value in _flatten(values or {}):
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    if include_crds:
        args.append("--include-crds")
    return [d for d in yaml.safe_load_all(helm(*args)) if d]


def _flatten(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out += _flatten(value, name + ".")
        else:
            out.append((name, value))
    return out
