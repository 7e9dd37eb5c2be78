"""The host release command of the end-to-end tests: the fake NVML host's "PCI remove".

The plugin runs it (``--host-release-command``) with ``COMPOSABLE_DRA_DEVICE_UUID`` in
its environment; it marks that GPU released in the shared host state, where the fabric
emulator reads it at the detach, and the fake NVML stops listing it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from composable_dra.model.names import normalize_uuid
from fabric_emulator import host_bus
from testbed.fake_nvml import HOST_ENV, ROOT_ENV


def main() -> int:
    root, host = Path(os.environ[ROOT_ENV]), os.environ[HOST_ENV]
    wanted = normalize_uuid(os.environ.get("COMPOSABLE_DRA_DEVICE_UUID", ""))
    found = [g.uuid for g in host_bus.gpus(root, host) if normalize_uuid(g.uuid) == wanted]
    try:
        host_bus.release(root, host, found[0] if found else wanted)
    except KeyError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
