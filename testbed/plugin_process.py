"""The kubelet plugin as its own process, for the end-to-end tests and the benchmarks.

A process of its own can be killed (SIGKILL, mid-flight) and started again over the same
directories, as a DaemonSet pod would be.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from dra_driver.plugin_main import DRIVER
from testbed.process import ComponentProcess


def write_static_devices(path: Path, devices: list[dict[str, Any]]) -> None:
    """Replace the static source's file atomically (the plugin may read it any time)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"devices": devices}))
    os.replace(tmp, path)


class NodeDirs(Protocol):
    """Where a node's kubelet looks for plugins and its runtime for CDI specs (a
    KubeletEmulator's or a RealNode's)."""

    @property
    def plugins_registry_dir(self) -> Path: ...
    @property
    def plugins_dir(self) -> Path: ...
    @property
    def cdi_dir(self) -> Path: ...


def redfish_source_args(endpoint: str, credentials_file: Path, poll_interval: float) -> list[str]:
    """The plugin's flags for the redfish device source (the GPUs the fabric attached)."""
    return [
        "--device-source=redfish",
        f"--redfish-endpoint={endpoint}",
        f"--redfish-credentials-file={credentials_file}",
        f"--poll-interval={poll_interval}",
    ]


@dataclass
class PluginProcess:
    """``composable-dra plugin`` for one node, with the static source unless told otherwise
    (``extra_args`` come last and win)."""

    node: str
    kubeconfig: Path
    plugins_registry_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    workdir: Path
    driver: str = DRIVER
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] | None = None  # None: this process's environment

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.static_file = self.workdir / "devices.yaml"
        self.state_dir = self.workdir / "state"
        self.boot_id_file = self.workdir / "boot_id"
        if not self.boot_id_file.exists():
            self.boot_id_file.write_text("boot-1\n")
        self.process = ComponentProcess("plugin", [], self.workdir, env=self.env)

    @classmethod
    def beside(
        cls,
        kubelet: NodeDirs,
        node: str,
        kubeconfig: Path,
        workdir: Path,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> PluginProcess:
        """The plugin of ``node`` on the directories of its kubelet (not started)."""
        return cls(
            node=node,
            kubeconfig=kubeconfig,
            plugins_registry_dir=kubelet.plugins_registry_dir,
            plugins_dir=kubelet.plugins_dir,
            cdi_dir=kubelet.cdi_dir,
            workdir=workdir,
            extra_args=list(extra_args),
            env=env,
        )

    @classmethod
    def standalone(
        cls, node: str, kubeconfig: Path, root: Path, extra_args: Sequence[str] = ()
    ) -> PluginProcess:
        """The plugin of ``node`` with no kubelet beside it: its kubelet directories and its
        own under ``root`` (not started)."""
        return cls(
            node=node,
            kubeconfig=kubeconfig,
            plugins_registry_dir=root / "registry",
            plugins_dir=root / "plugins",
            cdi_dir=root / "cdi",
            workdir=root / "plugin",
            extra_args=list(extra_args),
        )

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    @property
    def starts(self) -> int:
        return self.process.starts

    def start(self) -> None:
        self.process.args = [
            f"--node-name={self.node}",
            f"--kubeconfig={self.kubeconfig}",
            f"--driver-name={self.driver}",
            f"--plugins-registry-dir={self.plugins_registry_dir}",
            f"--plugins-dir={self.plugins_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--state-dir={self.state_dir}",
            f"--boot-id-file={self.boot_id_file}",
            "--device-source=static",
            f"--static-file={self.static_file}",
            "--poll-interval=0.2",
            *self.extra_args,
        ]
        self.process.start()

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node's plugin pod is killed."""
        self.process.kill()

    def stop(self) -> int | None:
        """SIGTERM, then wait; the exit code."""
        return self.process.stop()

    def alive(self) -> bool:
        return self.process.alive()

    def logged(self, event: str) -> bool:
        """Whether the current process logged ``event``."""
        return any(e.get("event") == event for e in self.process.log_events(current_only=True))

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)
