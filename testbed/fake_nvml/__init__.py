"""A file-backed fake NVML for the end-to-end tests (``pynvml.py``; its directory on a
plugin's PYTHONPATH makes the plugin's ``import pynvml`` load it) and the host's release
command (``release.py``). Its state is the emulated host's PCIe side that the fabric
emulator shares (fabric_emulator/host_bus.py): the GPUs the fabric attached to the host,
their processes, XID events, ECC counters, a lost GPU.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

# Put this on a process's PYTHONPATH for ``import pynvml`` to be the fake.
PYTHONPATH = str(Path(__file__).resolve().parent)
_REPOSITORY = str(Path(__file__).resolve().parents[2])  # for testbed.fake_nvml.release
ROOT_ENV = "FAKE_NVML_ROOT"  # the shared directory (the emulator's --host-state-dir)
HOST_ENV = "FAKE_NVML_HOST"  # the fabric host this process runs on


def plugin_args(poll_interval: float, release: bool = True) -> list[str]:
    """A plugin's flags for the fake NVML: the nvml source and, unless ``release`` is off
    (a plugin that skips its release step), the fake's release command."""
    args = ["--device-source=nvml", f"--poll-interval={poll_interval}"]
    return [*args, *release_args()] if release else args


def release_args() -> list[str]:
    """The plugin flag for the emulated host's release command (``release.py``), for any
    device source: a plugin on the redfish source, which knows no processes, releases a
    GPU by this command alone, and the emulator sees it in the host state."""
    command = shlex.join([sys.executable, "-m", "testbed.fake_nvml.release"])
    return [f"--host-release-command={command}"]


def release_env(root: Path, host: str) -> dict[str, str]:
    """The environment the release command needs (this process's, with the repository
    on its PYTHONPATH and where ``host``'s state is), without the fake NVML."""
    return {**os.environ, "PYTHONPATH": _REPOSITORY, ROOT_ENV: str(root), HOST_ENV: host}


def env(root: Path, host: str) -> dict[str, str]:
    """The environment a plugin process needs to see ``host``'s GPUs through the fake
    (``release_env``, with the fake first on its PYTHONPATH)."""
    path = os.pathsep.join([PYTHONPATH, _REPOSITORY])
    return {**release_env(root, host), "PYTHONPATH": path}
