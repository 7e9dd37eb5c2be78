"""The kubelet emulator's containers: CDI edits applied to a process (pure parts), and
one real process per container for the lifecycle."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.containers import (
    ContainerError,
    Containers,
    apply_cdi,
    bind,
    cdi_edits,
    pod_phase,
    under_root,
)
from testbed.wait import wait_for

ROOT = Path("/run/pods/u/main/rootfs")


def test_env_edits_follow_the_container_env_and_later_edits_win() -> None:
    applied = apply_cdi(
        {"A": "container", "B": "kept"},
        [{"env": ["A=first", "C=x=y"]}, {"env": ["A=second"]}],
        ROOT,
    )
    assert applied.env == {"A": "second", "B": "kept", "C": "x=y"}
    assert applied.mounts == []


def test_mounts_land_under_the_root_and_env_pointing_at_them_follows() -> None:
    applied = apply_cdi(
        {"UNRELATED": "/var/run/remote-gpu-other"},
        [
            {
                "env": [
                    "REMOTE_GPU_TOKEN_FILE=/var/run/remote-gpu/token",
                    "INSIDE=/var/run/remote-gpu/sub/file",
                    "REMOTE_GPU_ENDPOINT=10.0.0.1:7470",
                ],
                "mounts": [
                    {
                        "hostPath": "/plugin/leases/abc/token",
                        "containerPath": "/var/run/remote-gpu/token",
                        "options": ["ro", "bind"],
                    },
                    {"hostPath": "/plugin/leases/abc", "containerPath": "/var/run/remote-gpu/"},
                ],
            }
        ],
        ROOT,
    )
    assert applied.env["REMOTE_GPU_TOKEN_FILE"] == str(ROOT / "var/run/remote-gpu/token")
    assert applied.env["INSIDE"] == str(ROOT / "var/run/remote-gpu/sub/file")
    assert applied.env["REMOTE_GPU_ENDPOINT"] == "10.0.0.1:7470"
    # A sibling path that only shares a prefix is not under the mount.
    assert applied.env["UNRELATED"] == "/var/run/remote-gpu-other"
    assert applied.mounts == [
        (Path("/plugin/leases/abc/token"), ROOT / "var/run/remote-gpu/token"),
        (Path("/plugin/leases/abc"), ROOT / "var/run/remote-gpu"),
    ]


@pytest.mark.parametrize(
    "edit",
    [
        {"env": ["NOEQUALS"]},
        {"env": ["1BAD=x"]},
        {"mounts": [{"containerPath": "/x"}]},
        {"mounts": [{"hostPath": "/h", "containerPath": "relative/x"}]},
        {"mounts": [{"hostPath": "/h", "containerPath": "/a/../../etc/passwd"}]},
        {"mounts": [{"hostPath": "/h", "containerPath": "/"}]},
    ],
)
def test_bad_edits_are_refused(edit: dict[str, object]) -> None:
    with pytest.raises(ContainerError):
        apply_cdi({}, [edit], ROOT)


@settings(max_examples=200)
@given(st.text(alphabet="/.ab", min_size=1, max_size=20))
def test_a_container_path_never_leaves_the_root(container_path: str) -> None:
    try:
        where = under_root(ROOT, container_path)
    except ContainerError:
        return
    assert where.is_relative_to(ROOT) and where != ROOT
    assert ".." not in where.relative_to(ROOT).parts


def test_cdi_edits_spec_wide_first_then_device(tmp_path: Path) -> None:
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "composable.dra.io/gpu",
        "containerEdits": {"env": ["COMMON=1"]},
        "devices": [
            {"name": "c-gpu-0", "containerEdits": {"env": ["X=0"]}},
            {"name": "c-gpu-1", "containerEdits": {"env": ["X=1"]}},
        ],
    }
    (tmp_path / "a.json").write_text(json.dumps(spec))
    (tmp_path / "broken.json").write_text("{")
    edits = cdi_edits(tmp_path, ["composable.dra.io/gpu=c-gpu-1"])
    assert edits == [{"env": ["COMMON=1"]}, {"env": ["X=1"]}]
    with pytest.raises(ContainerError, match="no spec"):
        cdi_edits(tmp_path, ["composable.dra.io/gpu=missing"])


@pytest.mark.parametrize(
    ("policy", "exits", "phase"),
    [
        ("Never", [0, 0], "Succeeded"),
        ("Never", [0, 3], "Failed"),
        ("Never", [None, 3], "Running"),
        ("OnFailure", [0], "Succeeded"),
        ("Always", [0], "Running"),
    ],
)
def test_pod_phase(policy: str, exits: list[int | None], phase: str) -> None:
    assert pod_phase(policy, exits) == phase


def _pod(command: list[str], policy: str, uid: str) -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "name": "p", "uid": uid},
        "spec": {
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "command": command,
                    "env": [{"name": "FROM_POD", "value": "yes"}],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _spec_with_mount(cdi: Path, host_file: Path) -> str:
    spec = {
        "kind": "composable.dra.io/gpu",
        "devices": [
            {
                "name": "d",
                "containerEdits": {
                    "env": ["TOKEN=/etc/lease/token", "GPU=GPU-1"],
                    "mounts": [{"hostPath": str(host_file), "containerPath": "/etc/lease/token"}],
                },
            }
        ],
    }
    cdi.mkdir()
    (cdi / "s.json").write_text(json.dumps(spec))
    return "composable.dra.io/gpu=d"


UID = "0b6c2f7e-1a2b-4c3d-8e9f-0123456789ab"


def test_a_process_sees_its_edits_and_its_exit_becomes_the_phase(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret")
    device = _spec_with_mount(tmp_path / "cdi", secret)
    changed = threading.Event()
    runner = Containers(tmp_path / "pods", tmp_path / "cdi", lambda _key: changed.set())
    script = 'echo "$FROM_POD $GPU $(cat "$TOKEN")"; exit 4'
    runner.start(_pod(["sh", "-c", script], "Never", UID), {"gpu": [device]})
    assert changed.wait(30)
    state = runner.status(UID)
    assert state is not None
    phase, [status] = state
    assert phase == "Failed"
    assert status["state"]["terminated"]["exitCode"] == 4
    assert runner.log(UID, "main") == "yes GPU-1 s3cret\n"
    runner.stop(UID)
    assert runner.status(UID) is None


def test_on_failure_restarts_until_success(tmp_path: Path) -> None:
    (tmp_path / "cdi").mkdir()
    runner = Containers(tmp_path / "pods", tmp_path / "cdi", lambda _key: None)
    # Fails on its first run, succeeds on its second (the marker lies in its root).
    script = "if [ -e marker ]; then exit 0; fi; touch marker; exit 1"
    runner.start(_pod(["sh", "-c", script], "OnFailure", UID), {})

    def finished() -> bool:
        state = runner.status(UID)
        return state is not None and state[0] == "Succeeded"

    wait_for(finished, 30, "the restarted container to succeed")
    state = runner.status(UID)
    assert state is not None
    assert state[1][0]["restartCount"] == 1
    runner.stop(UID)


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    (tmp_path / "cdi").mkdir()
    runner = Containers(tmp_path / "pods", tmp_path / "cdi", lambda _key: None)
    runner.start(_pod(["sh", "-c", "sleep 300 & echo $! > child; wait"], "Never", UID), {})
    child = tmp_path / "pods" / UID / "main" / "rootfs" / "child"
    wait_for(lambda: child.exists() and child.read_text().strip() != "", 10, "the child's pid")
    pid = int(child.read_text())
    runner.stop(UID)
    wait_for(lambda: gone(pid), 10, f"the container's child {pid} to end")


def gone(pid: int) -> bool:
    """No process ``pid``, or only its zombie (its new parent reaps it in its own time)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_names_that_would_make_paths_are_checked(tmp_path: Path) -> None:
    runner = Containers(tmp_path / "pods", tmp_path / "cdi", lambda _key: None)
    with pytest.raises(ContainerError):
        runner.start(_pod(["true"], "Never", "../../etc"), {})
    bad = _pod(["true"], "Never", UID)
    bad["spec"]["containers"][0]["name"] = "../x"  # type: ignore[index]
    with pytest.raises(ContainerError):
        runner.start(bad, {})
    assert not (tmp_path / "pods").exists() or not any((tmp_path / "pods").iterdir())


def test_a_mounted_file_keeps_its_inode_and_a_mounted_directory_shows_new_files(
    tmp_path: Path,
) -> None:
    """As a bind mount: a file renamed over the host path is not seen through a file
    mount (why the plugin mounts the lease's directory), and is through a directory's."""
    host_dir, root = tmp_path / "lease", tmp_path / "root"
    host_dir.mkdir()
    root.mkdir()
    (host_dir / "token").write_text("old")
    bind(host_dir / "token", root / "token")
    bind(host_dir, root / "dir")
    (host_dir / "token.tmp").write_text("new")
    os.replace(host_dir / "token.tmp", host_dir / "token")
    assert (root / "token").read_text() == "old"
    assert (root / "dir" / "token").read_text() == "new"
