"""Running the plugin as its own process, for the end-to-end tests and the benchmark.

Not used by the plugin itself. A process of its own can be killed (SIGKILL, mid-flight)
and started again over the same directories, as a DaemonSet pod would be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_driver.plugin_main import DRIVER


def write_static_devices(path: Path, devices: list[dict[str, Any]]) -> None:
    """Replace the static source's file atomically (the plugin may read it any time)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"devices": devices}))
    os.replace(tmp, path)


@dataclass
class PluginProcess:
    """``composable-dra plugin`` with the static source, for one node."""

    node: str
    kubeconfig: Path
    plugins_registry_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    workdir: Path
    driver: str = DRIVER
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.static_file = self.workdir / "devices.yaml"
        self.state_dir = self.workdir / "state"
        self.boot_id_file = self.workdir / "boot_id"
        if not self.boot_id_file.exists():
            self.boot_id_file.write_text("boot-1\n")

    @property
    def log_path(self) -> Path:
        return self.workdir / f"plugin-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        script = Path(sys.executable).parent / "composable-dra"
        command = [str(script)] if script.exists() else [sys.executable, "-m", "composable_dra.cli"]
        args = [
            *command,
            "--log-format=json",
            "plugin",
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
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node's plugin pod is killed."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int | None:
        """SIGTERM, then wait; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_events(self) -> list[dict[str, Any]]:
        """The current process's JSON log lines."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out

    def logged(self, event: str) -> bool:
        return any(e.get("event") == event for e in self.log_events())

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
