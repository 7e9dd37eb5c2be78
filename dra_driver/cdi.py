"""CDI spec files: one per prepared claim, written atomically before prepare returns.

Every device name carries the claim UID, so two claims never share a CDI device and a
spec is removed with its claim without touching anyone else's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from composable_dra.model import names, remote_env
from dra_driver.claimref import InvalidClaimRef, check_uid
from dra_driver.fsutil import atomic_write

CDI_VERSION = "0.6.0"
VENDOR = "composable.dra.io"
CLASS = "gpu"
KIND = f"{VENDOR}/{CLASS}"


@dataclass(frozen=True)
class CdiDevice:
    """One device of a claim as a container will see it."""

    device_name: str  # the ResourceSlice device name
    uuid: str
    env: dict[str, str] = field(default_factory=dict)
    device_nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RemoteCdiDevice:
    """A lent GPU as a container sees it: where its donor is, and the lease's directory
    (its token and endpoint files)."""

    name: str  # the CDI device's (``remote_key.RemoteKey.cdi_name``)
    endpoint: str
    lease: int
    directory: str  # on the host
    container_directory: str


def remote_edits(dev: RemoteCdiDevice, index: int = 0, count: int = 1) -> dict[str, Any]:
    """Remote device ``index`` of the claim's ``count``: what
    ``remote_gpu.client.RemoteGPU.from_env()`` and ``all_from_env()`` read
    (``composable_dra.model.remote_env``), and the lease's directory mounted (a directory,
    not its files: files the plugin replaces in it reach a running container). The one
    place that says what a container sees of a lease."""
    env = remote_env.lease_env(index, count, dev.endpoint, dev.lease, dev.container_directory)
    mount = {
        "hostPath": dev.directory,
        "containerPath": dev.container_directory,
        "options": ["ro", "bind"],
    }
    return {"env": [f"{k}={v}" for k, v in env.items()], "mounts": [mount]}


def cdi_device_name(claim_uid: str, device_name: str) -> str:
    return f"{claim_uid}-{device_name}"


def qualified(name: str) -> str:
    """The fully qualified CDI device ID that NodePrepareResources returns."""
    return f"{KIND}={name}"


def cdi_device_id(claim_uid: str, device_name: str) -> str:
    return qualified(cdi_device_name(claim_uid, device_name))


def spec_file_name(claim_uid: str) -> str:
    return f"{VENDOR}-{CLASS}_{claim_uid}.json"


def _env_suffix(device_name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", device_name.upper())


def build_spec(
    claim_uid: str, devices: Sequence[CdiDevice], remote: Sequence[RemoteCdiDevice] = ()
) -> dict[str, Any]:
    """The CDI spec for one claim.

    Each device sets the claim-wide lists (same value on every device of the claim, so
    merging edits never conflicts), its own UUID variable, the config's env, and the
    device nodes the source reported.
    """
    uuids = ",".join(d.uuid for d in devices)
    nvidia_ids = ",".join(names.nvidia_gpu_id(d.uuid) for d in devices)
    spec_devices = []
    for dev in devices:
        env = {
            "COMPOSABLE_GPU_UUIDS": uuids,
            "NVIDIA_VISIBLE_DEVICES": nvidia_ids,
            "COMPOSABLE_GPU_CLAIM_UID": claim_uid,
            f"COMPOSABLE_GPU_{_env_suffix(dev.device_name)}_UUID": dev.uuid,
            **dev.env,
        }
        edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in env.items()]}
        if dev.device_nodes:
            edits["deviceNodes"] = [{"path": p} for p in dev.device_nodes]
        spec_devices.append(
            {"name": cdi_device_name(claim_uid, dev.device_name), "containerEdits": edits}
        )
    for index, rdev in enumerate(remote):
        spec_devices.append(
            {
                "name": rdev.name,
                "containerEdits": remote_edits(rdev, index, len(remote)),
            }
        )
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": spec_devices}


class CdiWriter:
    def __init__(self, cdi_dir: Path, durable: bool = True) -> None:
        self.cdi_dir = cdi_dir
        self.durable = durable

    def path_for(self, claim_uid: str) -> Path:
        """The claim's spec file; InvalidClaimRef for a UID that would lead elsewhere.

        The gRPC edge refuses such UIDs already; this is the second line, where the path
        is built.
        """
        path = self.cdi_dir / spec_file_name(check_uid(claim_uid))
        # Normalised, not resolved: a spec file that is a symlink is replaced or
        # unlinked itself, never followed.
        if os.path.dirname(os.path.abspath(path)) != os.path.abspath(self.cdi_dir):
            raise InvalidClaimRef(f"claim UID {claim_uid!r} leads outside {self.cdi_dir}")
        return path

    def write(self, claim_uid: str, spec: dict[str, Any]) -> Path:
        path = self.path_for(claim_uid)
        atomic_write(path, json.dumps(spec, indent=2).encode(), durable=self.durable)
        return path

    def read(self, claim_uid: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.path_for(claim_uid).read_text())
        except FileNotFoundError:
            return None
        return data

    def remove(self, claim_uid: str) -> bool:
        try:
            self.path_for(claim_uid).unlink()
        except FileNotFoundError:
            return False
        return True


def resolve(cdi_dir: Path, device_id: str) -> dict[str, Any] | None:
    """The CDI device a fully qualified ID names, found in any spec under ``cdi_dir``.

    What a container runtime does before it starts a container; the tests use it.
    """
    kind, _, name = device_id.partition("=")
    for path in sorted(cdi_dir.glob("*.json")):
        spec = json.loads(path.read_text())
        if spec.get("kind") != kind:
            continue
        for dev in spec.get("devices", []):
            if dev.get("name") == name:
                found: dict[str, Any] = dev
                return found
    return None
