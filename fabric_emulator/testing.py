"""Run the fabric emulator as a subprocess, for tests and demos.

    from fabric_emulator.testing import EmulatorProcess

    with EmulatorProcess(async_polls=0) as emu:      # port 0: a free port is picked
        emu.url                                      # "http://127.0.0.1:PORT"
        emu.add_fault({"kind": "status503", "count": 1, "path": "AddResourceBlock"})
        emu.state()["blocks"]["gpu-1"]["state"]      # "Unused" / "Composing" / "Composed"
        emu.reset()                                  # composition, tasks and faults back to new
        emu.surprise_removals()                      # blocks removed while a host held them

Start waits on the emulator's ready file (no sleeps); stop sends SIGINT and waits, then
kills. Only the standard library is used here, so any component's tests can import it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from fabric_emulator import persistence


class EmulatorError(RuntimeError):
    pass


class EmulatorProcess:
    """One emulator process. ``start()`` returns the base URL; ``stop()`` ends it."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        topology: str | Path | dict[str, Any] | None = None,
        async_polls: int = 0,
        retry_after: int = 1,
        task_seconds: int = 10,
        faults: list[dict[str, Any]] | None = None,
        state_file: str | Path | None = None,
        user: str = "admin",
        password: str = "admin",  # noqa: S107 - the emulator's documented default
        extra_args: Sequence[str] = (),
        workdir: str | Path | None = None,
        host_state_dir: str | Path | None = None,
    ) -> None:
        self._owned_dir: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._owned_dir = tempfile.TemporaryDirectory(prefix="fabric-emulator-")
            workdir = self._owned_dir.name
        self.workdir = Path(workdir)
        self.user, self.password = user, password
        self.log_path = self.workdir / "emulator.log"
        self._ready = self.workdir / "ready"
        self.state_file = Path(state_file) if state_file is not None else None
        args = ["--host", host, "--port", str(port), "--ready-file", str(self._ready)]
        args += ["--async-polls", str(async_polls), "--retry-after", str(retry_after)]
        args += ["--task-seconds", str(task_seconds)]
        args += ["--user", user]
        secret = self.workdir / "password"
        persistence.save_text(secret, password)
        os.chmod(secret, 0o600)
        args += ["--password-file", str(secret)]
        # The admin API is guarded here as in a cluster: every call carries the token.
        self.admin_token = secrets.token_hex(16)
        token_file = self.workdir / "admin-token"
        persistence.save_text(token_file, self.admin_token)
        os.chmod(token_file, 0o600)
        args += ["--admin-token-file", str(token_file)]
        if isinstance(topology, dict):
            path = self.workdir / "topology.json"
            persistence.save_text(path, json.dumps(topology))
            args += ["--topology", str(path)]
        elif topology is not None:
            args += ["--topology", str(topology)]
        if faults:
            path = self.workdir / "faults.json"
            persistence.save_text(path, json.dumps(faults))
            args += ["--faults", str(path)]
        if self.state_file is not None:
            args += ["--state-file", str(self.state_file)]
        # The hosts' PCIe side, shared with their fake NVML (host_bus.py); None: untracked.
        self.host_state_dir = Path(host_state_dir) if host_state_dir is not None else None
        if self.host_state_dir is not None:
            args += ["--host-state-dir", str(self.host_state_dir)]
        self.args = [*args, *extra_args]
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> str:
        if self.proc is not None:
            raise EmulatorError("already started")
        self._ready.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "composable_dra_cli",
            "--log-format",
            "json",
            "fabric-emulator",
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self._ready.exists():
                text = self._ready.read_text(encoding="utf-8").strip()
                if text:
                    self.url = text
                    return text
            if self.proc.poll() is not None:
                raise EmulatorError(
                    f"emulator exited with {self.proc.returncode}: {self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise EmulatorError(f"emulator not ready after {timeout}s: {self.log_tail()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)

    def restart(self, timeout: float = 30.0) -> str:
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        self.stop()
        if self._owned_dir is not None:
            self._owned_dir.cleanup()
            self._owned_dir = None

    def __enter__(self) -> EmulatorProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # ---- admin API -----------------------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        """Call ``/admin/...``; returns the decoded JSON answer (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(  # noqa: S310 - our own http:// URL
            f"{self.url}/admin/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.admin_token}",
            },
        )
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            raw = resp.read()
        return json.loads(raw) if raw else None

    def add_fault(self, rule: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.admin("POST", "faults", rule)
        return result

    def set_faults(self, rules: list[dict[str, Any]]) -> None:
        self.admin("PUT", "faults", {"rules": rules})

    def faults(self) -> list[dict[str, Any]]:
        rules: list[dict[str, Any]] = self.admin("GET", "faults")["rules"]
        return rules

    def clear_faults(self) -> None:
        self.admin("DELETE", "faults")

    def set_block_status(self, block: str, health: str = "OK", state: str = "Enabled") -> None:
        """The Redfish Status the block and its GPU report from now on."""
        self.admin("PUT", f"blocks/{block}/status", {"Health": health, "State": state})

    def configure(self, **settings: int) -> dict[str, Any]:
        """Change ``async_polls`` / ``retry_after`` at run time."""
        result: dict[str, Any] = self.admin("PATCH", "config", settings)
        return result

    def state(self) -> dict[str, Any]:
        result: dict[str, Any] = self.admin("GET", "state")
        return result

    def reset(self) -> None:
        self.admin("POST", "reset")

    def surprise_removals(self) -> list[dict[str, str]]:
        """Blocks the fabric removed while their host still held them (host_bus.py)."""
        found: list[dict[str, str]] = self.state().get("surprise_removals", [])
        return found
