"""The plugin's checkpoint: which claims are prepared here, with what, in two phases.

A claim is recorded ``preparing`` before its CDI spec is written and ``prepared`` after,
each step an atomic replacement of one JSON file carrying a checksum. After a restart the
plugin answers a repeated prepare from here (same CDI IDs, no new side effects). A
checkpoint from another boot is stale (CDI specs under /var/run are gone with the boot)
and is discarded.

Two plugin instances share the file during a rolling update (the old pod still serving
while the new one registers), so every prepare and unprepare runs under an exclusive
``flock`` on ``<checkpoint>.lock`` and starts from the file as it is now, not from what
this process last saw.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from composable_dra.model.gpu_config import QosConfig
from composable_dra.process import logs
from dra_driver.fsutil import atomic_write

VERSION = 1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "unknown"


class RemoteLeaseRecord(BaseModel):
    """A remote device's lease: where its token file is, and whom to close it with."""

    model_config = ConfigDict(extra="forbid")

    donor: str
    lease: int
    endpoint: str


class PreparedDevice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_names: list[str]
    pool_name: str
    device_name: str  # as allocated (a pool device keeps its pool name here)
    local_name: str  # the node-local device it maps to
    uuid: str
    cdi_device_ids: list[str]
    shareable: bool = False
    share_id: str | None = None
    remote: RemoteLeaseRecord | None = None
    # The claim's QoS profile for this device: the host headroom it needs stays kept.
    qos: QosConfig | None = None


class ClaimRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    uid: str
    namespace: str
    name: str
    state: Literal["preparing", "prepared"]
    devices: list[PreparedDevice] = Field(default_factory=list)
    cdi_spec: dict[str, Any] = Field(default_factory=dict)


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = VERSION
    boot_id: str
    claims: dict[str, ClaimRecord] = Field(default_factory=dict)


class CheckpointError(RuntimeError):
    pass


def _checksum(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


class Checkpoint:
    """In memory, mirrored to ``path`` on every change. Not thread-safe: callers lock."""

    def __init__(self, path: Path, boot_id: str, durable: bool = True) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self.durable = durable
        self._boot_id = boot_id
        self._log = logs.get(__name__)
        with self.exclusive(reload=False):
            self._data = self._load(boot_id)

    @contextlib.contextmanager
    def exclusive(self, reload: bool = True) -> Iterator[None]:
        """Hold the cross-process lock; with ``reload``, first read what another instance
        may have written since. The lock file is separate because saving replaces the
        checkpoint's inode, and a lock on a replaced inode excludes nobody."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if reload:
                self._data = self._load(self._boot_id)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _load(self, boot_id: str) -> _Data:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return _Data(boot_id=boot_id)
        try:
            outer = json.loads(raw)
            payload = json.dumps(outer["data"], sort_keys=True, separators=(",", ":")).encode()
            if outer.get("checksum") != _checksum(payload):
                raise CheckpointError("checksum mismatch")
            data = _Data.model_validate(outer["data"])
        except (ValueError, KeyError, TypeError, CheckpointError) as exc:
            # A file we wrote atomically is never torn; this one was edited or damaged.
            # Refuse to guess which claims are prepared.
            raise CheckpointError(f"checkpoint {self.path} is unreadable: {exc}") from exc
        if data.boot_id != boot_id:
            self._log.info("checkpoint from another boot discarded", claims=len(data.claims))
            fresh = _Data(boot_id=boot_id)
            self._data = fresh
            self.save()  # persist the discard: the old claims must never come back
            return fresh
        return data

    def save(self) -> None:
        data = self._data.model_dump(mode="json")
        payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        body = json.dumps({"checksum": _checksum(payload), "data": data}).encode()
        atomic_write(self.path, body, mode=0o600, durable=self.durable)

    @property
    def claims(self) -> dict[str, ClaimRecord]:
        return self._data.claims

    def get(self, uid: str) -> ClaimRecord | None:
        return self._data.claims.get(uid)

    def put(self, record: ClaimRecord) -> None:
        self._data.claims[record.uid] = record
        self.save()

    def remove(self, uid: str) -> bool:
        if self._data.claims.pop(uid, None) is None:
            return False
        self.save()
        return True
