"""Containers for the kubelet emulator: each container's command run as a local process.

What a container runtime does with CDI, done on the host instead of in a namespace:
- the container's env, then the CDI ``containerEdits`` of its devices (spec-wide edits,
  then the device's; a later value of a variable wins, as the CDI library merges them);
- each CDI mount appears at ``<container root>/<containerPath>`` as a bind mount shows
  its ``hostPath`` (``bind``: a directory by a symlink, a file by a hard link to the
  inode mounted), and every env value that points at a mounted path is rewritten to the
  path under the root, so a process that opens ``$REMOTE_GPU_TOKEN_FILE`` reads the
  mounted file;
- device nodes are not created (no device exists here); hooks are not run.

The process runs in its container root, in its own session (so a stop reaches its
children), with stdout and stderr in one log file per container. Its exit code becomes
the container's ``terminated`` state and, with the pod's ``restartPolicy``, the pod's
phase: Never keeps the exit; OnFailure restarts a non-zero exit, Always any exit (with
the kubelet's doubling back-off, capped here at ``RESTART_BACKOFF_MAX``).

The emulator's interpreter directory is first on PATH and PYTHONPATH is passed on (the
project image's ``python`` has the project installed; here the test's tree is the image).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from composable_dra.k8s.kube import JSON
from composable_dra.process import logs

RESTART_BACKOFF_MAX = 5.0
STOP_GRACE_MAX = 5.0  # seconds a stopped container gets before SIGKILL, at most
# Container names are DNS labels; pod UIDs are UUIDs: both become path components.
_CONTAINER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_POD_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")

log = logs.get(__name__)


class ContainerError(Exception):
    """A container cannot be started as written (bad name, CDI edit or path)."""


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def checked_name(name: str) -> str:
    if not _CONTAINER_NAME.fullmatch(name):
        raise ContainerError(f"container name {name!r} is not a DNS label")
    return name


def checked_uid(uid: str) -> str:
    if not _POD_UID.fullmatch(uid):
        raise ContainerError(f"pod UID {uid!r} is not a UUID")
    return uid


def under_root(root: Path, container_path: str) -> Path:
    """Where ``container_path`` (absolute, inside the container) lies under ``root``."""
    pure = PurePosixPath(container_path)
    if not pure.is_absolute() or ".." in pure.parts:
        raise ContainerError(f"container path {container_path!r} is not absolute and plain")
    parts = pure.parts[1:]  # after the root, which may be spelled "/" or "//"
    if not parts:
        raise ContainerError("a mount over the container's root is not supported")
    return root.joinpath(*parts)


@dataclass(frozen=True)
class Applied:
    """A container's environment and mounts after its CDI edits."""

    env: dict[str, str]
    mounts: list[tuple[Path, Path]]  # (host path, where it appears under the root)


def on_host(value: str, mounts: Mapping[str, str]) -> str:
    """A container path as the host sees it, through the mounts (container path -> host
    path) it lies under; other values unchanged."""
    return _rewrite(value, {k: Path(v) for k, v in mounts.items()})


def _rewrite(value: str, mounts: Mapping[str, Path]) -> str:
    """A value that is a mounted container path (or lies under one), as seen from the host."""
    for container_path, host_view in sorted(mounts.items(), key=lambda m: -len(m[0])):
        if value == container_path:
            return str(host_view)
        if value.startswith(container_path.rstrip("/") + "/"):
            return str(host_view) + value[len(container_path.rstrip("/")) :]
    return value


def apply_cdi(env: Mapping[str, str], edits: Iterable[JSON], root: Path) -> Applied:
    """The container's env and mounts once ``edits`` (CDI containerEdits, in order) apply.

    Pure: nothing is created. ContainerError for an env entry without ``=``, a bad
    variable name, a mount without paths or one whose container path is not plain.
    """
    out = dict(env)
    mounts: dict[str, Path] = {}
    links: list[tuple[Path, Path]] = []
    for edit in edits:
        for entry in edit.get("env") or []:
            name, sep, value = str(entry).partition("=")
            if not sep or not _ENV_NAME.fullmatch(name):
                raise ContainerError(f"CDI env entry {entry!r} is not NAME=VALUE")
            out[name] = value
        for mount in edit.get("mounts") or []:
            host, target = mount.get("hostPath"), mount.get("containerPath")
            if not isinstance(host, str) or not isinstance(target, str) or not host:
                raise ContainerError(f"CDI mount {mount!r} needs hostPath and containerPath")
            view = under_root(root, target)
            mounts[str(PurePosixPath(target))] = view
            links.append((Path(host), view))
    rewritten = {k: _rewrite(v, mounts) for k, v in out.items()}
    return Applied(rewritten, links)


def cdi_devices(cdi_dir: Path) -> dict[str, list[JSON]]:
    """Every device of the CDI specs in ``cdi_dir`` by its fully qualified name
    (vendor/class=name): its edits, the spec-wide ones first. Unreadable specs are skipped,
    as a runtime skips them."""
    found: dict[str, list[JSON]] = {}
    for spec_file in sorted(cdi_dir.glob("*.json")):
        try:
            spec = json.loads(spec_file.read_text())
        except (OSError, ValueError):
            continue
        kind = spec.get("kind", "")
        common = spec.get("containerEdits")
        for dev in spec.get("devices", []):
            edits = [common] if common else []
            if dev.get("containerEdits"):
                edits.append(dev["containerEdits"])
            found[f"{kind}={dev.get('name', '')}"] = edits
    return found


def cdi_edits(cdi_dir: Path, device_ids: Sequence[str]) -> list[JSON]:
    """The containerEdits of each CDI device ID, spec-wide edits first, in ID order.

    ContainerError for an ID that no spec under ``cdi_dir`` names (a runtime refuses
    to start such a container).
    """
    found = cdi_devices(cdi_dir)
    out: list[JSON] = []
    for device_id in device_ids:
        if device_id not in found:
            raise ContainerError(f"CDI device {device_id} is in no spec under {cdi_dir}")
        out.extend(found[device_id])
    return out


def container_env(container: JSON) -> dict[str, str]:
    """The container's literal env (``valueFrom`` is not resolved by the emulator)."""
    return {
        e["name"]: str(e["value"])
        for e in container.get("env") or []
        if "value" in e and _ENV_NAME.fullmatch(e.get("name", ""))
    }


def host_env() -> dict[str, str]:
    """What the process gets from the host: the emulator's interpreter first on PATH."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {"PATH": path}
    for name in ("PYTHONPATH", "LANG", "TMPDIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def bind(host: Path, view: Path) -> None:
    """A bind mount's view of ``host`` at ``view``: a directory by name (a symlink: its
    entries, new ones too, show through, as in a mounted directory), a file by inode (a
    hard link: a file later renamed over ``host`` is not seen, as a mounted file's inode
    stays the one mounted; a copy where the two lie on different filesystems)."""
    if host.is_dir() or not host.exists():
        view.symlink_to(host)
        return
    try:
        os.link(host, view)
    except OSError:
        shutil.copy2(host, view)


def pod_phase(policy: str, exits: Sequence[int | None]) -> str:
    """The pod's phase from its containers' exit codes (None: running or restarting)."""
    if policy == "Always" or any(code is None for code in exits):
        return "Running"
    return "Succeeded" if all(code == 0 for code in exits) else "Failed"


def restarts(policy: str, code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and code != 0)


@dataclass
class _Container:
    name: str
    argv: list[str]
    applied: Applied
    root: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    finished_at: str = ""
    exit_code: int | None = None
    reason: str = ""
    restart_count: int = 0
    container_id: str = ""

    def status(self, image: str) -> JSON:
        state: JSON
        if self.exit_code is None:
            state = {"running": {"startedAt": self.started_at}}
        else:
            state = {
                "terminated": {
                    "exitCode": self.exit_code,
                    "reason": self.reason,
                    "startedAt": self.started_at,
                    "finishedAt": self.finished_at,
                }
            }
        return {
            "name": self.name,
            "image": image,
            "imageID": "",
            "containerID": self.container_id,
            "ready": self.exit_code is None,
            "started": self.exit_code is None,
            "restartCount": self.restart_count,
            "state": state,
        }


@dataclass
class _Pod:
    key: str
    uid: str
    policy: str
    grace: float
    images: dict[str, str]
    containers: list[_Container]
    stopping: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)


def runs_processes(pod: JSON) -> bool:
    """Pods with a command in every container run as processes; others are only marked."""
    containers = pod["spec"].get("containers") or []
    return bool(containers) and all(c.get("command") for c in containers)


class Containers:
    """The container processes of one emulated node."""

    def __init__(
        self, root: Path, cdi_dir: Path, on_change: Callable[[str], None], node: str = ""
    ) -> None:
        self.root = Path(root)
        self.cdi_dir = Path(cdi_dir)
        self.on_change = on_change
        self._lock = threading.Lock()
        self._pods: dict[str, _Pod] = {}  # pod uid ->
        self._log = log.bind(node=node)

    def started(self, uid: str) -> bool:
        with self._lock:
            return uid in self._pods

    def start(self, pod: JSON, devices: Mapping[str, Sequence[str]]) -> None:
        """Start the pod's containers; ``devices``: pod claim name -> its CDI device IDs.

        ContainerError (nothing started) when a container cannot be set up.
        """
        meta, spec = pod["metadata"], pod["spec"]
        uid = checked_uid(meta["uid"])
        pod_dir = self.root / uid
        containers = []
        for c in spec.get("containers") or []:
            name = checked_name(c["name"])
            refs = c.get("resources", {}).get("claims") or []
            ids = [i for ref in refs for i in devices.get(ref["name"], [])]
            root = pod_dir / name / "rootfs"
            applied = apply_cdi(container_env(c), cdi_edits(self.cdi_dir, ids), root)
            argv = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
            containers.append(_Container(name, argv, applied, root, pod_dir / name / "log"))
        grace = spec.get("terminationGracePeriodSeconds")
        entry = _Pod(
            key=f"{meta['namespace']}/{meta['name']}",
            uid=uid,
            policy=spec.get("restartPolicy", "Always"),
            grace=min(STOP_GRACE_MAX, 30.0 if grace is None else float(grace)),
            images={c["name"]: c.get("image", "") for c in spec.get("containers") or []},
            containers=containers,
        )
        for c in containers:
            c.root.mkdir(parents=True, exist_ok=True)
            for host, view in c.applied.mounts:
                view.parent.mkdir(parents=True, exist_ok=True)
                if view.is_symlink() or view.exists():
                    view.unlink()
                bind(host, view)
        with self._lock:
            self._pods[uid] = entry
        for c in containers:
            self._launch(c)
            t = threading.Thread(
                target=self._watch, args=(entry, c), name=f"container-{c.name}", daemon=True
            )
            entry.threads.append(t)
            t.start()

    def _launch(self, c: _Container) -> None:
        c.started_at, c.finished_at, c.exit_code, c.reason = now_rfc3339(), "", None, ""
        c.container_id = f"process://{uuid.uuid4().hex}"
        with open(c.log_path, "ab") as out:
            try:
                c.proc = subprocess.Popen(
                    c.argv,
                    cwd=c.root,
                    env={**host_env(), **c.applied.env},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                # What a runtime reports for a command it cannot exec.
                out.write(f"cannot start {c.argv[:1]}: {exc}\n".encode())
                c.proc = None
                c.exit_code, c.reason, c.finished_at = 128, "StartError", now_rfc3339()

    def _watch(self, pod: _Pod, c: _Container) -> None:
        attempt = 0
        while True:
            if c.proc is not None:
                code = c.proc.wait()
                c.exit_code, c.finished_at = code, now_rfc3339()
                c.reason = "Completed" if code == 0 else "Error"
            assert c.exit_code is not None
            self.on_change(pod.key)
            if pod.stopping.is_set() or not restarts(pod.policy, c.exit_code):
                return
            attempt += 1
            if pod.stopping.wait(min(RESTART_BACKOFF_MAX, 0.5 * 2 ** (attempt - 1))):
                return
            c.restart_count += 1
            self._launch(c)
            self.on_change(pod.key)

    def status(self, uid: str) -> tuple[str, list[JSON]] | None:
        """(pod phase, containerStatuses) of a started pod; None for one not started."""
        with self._lock:
            pod = self._pods.get(uid)
        if pod is None:
            return None
        phase = pod_phase(pod.policy, [c.exit_code for c in pod.containers])
        return phase, [c.status(pod.images.get(c.name, "")) for c in pod.containers]

    def log(self, uid: str, container: str) -> str:
        """What the container printed so far ('' before it started)."""
        path = self.root / checked_uid(uid) / checked_name(container) / "log"
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, uid: str) -> None:
        """SIGTERM to each container's session, SIGKILL after the grace period; waits."""
        with self._lock:
            pod = self._pods.pop(uid, None)
        if pod is None:
            return
        pod.stopping.set()
        for c in pod.containers:
            if c.proc is not None and c.proc.poll() is None:
                _signal(c.proc, signal.SIGTERM)
        for c in pod.containers:
            if c.proc is None:
                continue
            try:
                c.proc.wait(timeout=pod.grace)
            except subprocess.TimeoutExpired:
                _signal(c.proc, signal.SIGKILL)
                c.proc.wait()
        for t in pod.threads:
            t.join(timeout=5)
        self._log.info("containers stopped", pod=pod.key)

    def stop_all(self) -> None:
        with self._lock:
            uids = list(self._pods)
        for uid in uids:
            self.stop(uid)


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def pod_status(phase: str, statuses: list[JSON], started: str) -> JSON:
    """The pod status the kubelet reports for ``phase`` and its containers' statuses."""
    stamp = now_rfc3339()
    ready = "True" if phase == "Running" and all(s["ready"] for s in statuses) else "False"
    conditions: list[JSON] = [
        {"type": t, "status": "True", "lastTransitionTime": started}
        for t in ("PodReadyToStartContainers", "Initialized", "PodScheduled")
    ]
    for t in ("ContainersReady", "Ready"):
        cond: JSON = {"type": t, "status": ready, "lastTransitionTime": stamp}
        if phase in ("Succeeded", "Failed"):
            cond["reason"] = "PodCompleted"
        conditions.append(cond)
    return {
        "phase": phase,
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "startTime": started,
        "conditions": conditions,
        "containerStatuses": statuses,
    }
