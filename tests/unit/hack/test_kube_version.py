"""KUBE_VERSION in the build scripts (hack/lib/k8s-wrapper.sh): which release is built and
from which wrapper module, and the cache by version. No Go and no network: the cached
directories are made up here (the real builds run in tests/e2e/test_api_features.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[3] / "hack"
PINNED = "v1.37.1"  # hack/control-plane/kubernetes/go.mod
ETCD = "v3.6.16"  # hack/control-plane/etcd/go.mod


def shell(script: str, cache: Path, version: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBE_VERSION"}
    env["COMPOSABLE_DRA_CACHE"] = str(cache)
    if version is not None:
        env["KUBE_VERSION"] = version
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30, check=False
    )


def library(call: str) -> str:
    return (
        f"set -euo pipefail; build_name=test; source {HACK}/lib/build.sh; "
        f"source {HACK}/lib/k8s-wrapper.sh; {call}"
    )


def fake_control_plane(cache: Path, version: str) -> Path:
    out = cache / "control-plane" / f"kubernetes-{version}_etcd-{ETCD}"
    out.mkdir(parents=True)
    for b in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        (out / b).write_text("#!/bin/sh\n")
        (out / b).chmod(0o755)
    return out


KUBE_VERSION = f"kube_version {HACK}/control-plane/kubernetes/go.mod"


def test_the_default_is_the_pinned_release(tmp_path: Path) -> None:
    out = shell(library(KUBE_VERSION), tmp_path, None)
    assert out.stdout.strip() == PINNED, out.stderr


def test_kube_version_names_another_release(tmp_path: Path) -> None:
    out = shell(library(KUBE_VERSION), tmp_path, "v1.35.8")
    assert out.stdout.strip() == "v1.35.8", out.stderr


@pytest.mark.parametrize("bad", ["1.35.8", "v1.35", "v1.35.8-rc.0", "v1.35.8; rm -rf /", "latest"])
def test_a_version_that_is_no_release_is_refused(tmp_path: Path, bad: str) -> None:
    out = shell(library(KUBE_VERSION), tmp_path, bad)
    assert out.returncode == 1 and not out.stdout
    assert "is not a Kubernetes release" in out.stderr


def test_the_pinned_release_builds_from_the_committed_wrapper(tmp_path: Path) -> None:
    out = shell(library(f"kube_module_dir {HACK}/node/kubelet {PINNED}"), tmp_path, None)
    assert out.stdout.strip() == f"{HACK}/node/kubelet", out.stderr


def test_another_release_builds_from_its_cached_generated_wrapper(tmp_path: Path) -> None:
    wrapper = tmp_path / "wrappers" / "kubernetes-v1.36.5"
    wrapper.mkdir(parents=True)
    (wrapper / "go.sum").write_text("")
    call = f"kube_module_dir {HACK}/control-plane/kubernetes v1.36.5"
    out = shell(library(f"PATH=/nonexistent; {call}"), tmp_path, None)  # no Go needed
    assert out.stdout.strip() == str(wrapper), out.stderr


def test_the_control_plane_build_reuses_the_named_release(tmp_path: Path) -> None:
    fake_control_plane(tmp_path, PINNED)
    older = fake_control_plane(tmp_path, "v1.35.8")
    script = f"bash {HACK}/control-plane/build.sh"
    out = shell(script, tmp_path, "v1.35.8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == str(older)
    assert "reusing cached binaries (kubernetes v1.35.8" in out.stderr
