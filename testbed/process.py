"""Run one of our components as its own process (`composable-dra <command> ...`)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path


def cli_command() -> list[str]:
    script = Path(sys.executable).parent / "composable-dra"
    return [str(script)] if script.exists() else [sys.executable, "-m", "composable_dra_cli"]


def donor_argv(
    name: str, secret: Path, listen: str, *extra: str, log_level: str = "warning"
) -> list[str]:
    """The command line of a remote GPU donor (quiet by default: warnings only) that lends
    as ``name`` on ``listen``, with ``extra`` flags (transports, --allow...)."""
    return [
        *cli_command(),
        "--log-level",
        log_level,
        "remote-gpu-donor",
        "--name",
        name,
        "--secret-file",
        str(secret),
        "--listen",
        listen,
        *extra,
    ]


@dataclass
class ComponentProcess:
    """A component process that tests can stop, kill (as a crash would) and start again."""

    command: str
    args: list[str]
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    env: dict[str, str] | None = field(default=None)
    # A program that is not ours (hack/vendor-plugin): run it instead of composable-dra.
    binary: Path | None = None

    @property
    def name(self) -> str:
        return self.command

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.command}-{self.starts}.log"

    def start(self) -> ComponentProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), *self.args]
                if self.binary
                else [*cli_command(), "--log-format=json", self.command, *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a pod is killed."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def log_events(self, current_only: bool = False) -> list[dict[str, object]]:
        """The JSON log lines of every start so far (or of the current one), oldest first."""
        out = []
        for i in range(self.starts if current_only else 1, self.starts + 1):
            with contextlib.suppress(OSError):
                text = (self.workdir / f"{self.command}-{i}.log").read_text(errors="replace")
                for line in text.splitlines():
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(line))
        return out

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- {self.command} ({self.log_path}) ---\n" + "\n".join(text[-lines:])
