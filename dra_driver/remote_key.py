"""What names one remote device of a claim on this node: (claim UID, pool, device).

Every donor lends a ``gpu-0-remote``, so one claim holding GPUs of two donors has two
devices of that name: the CDI device, the lease directory on the host and its mount in the
container are keyed by the pool (the donor's node) as well. Paths are built from checked
names only: a UID (``check_uid``), a node name (a DNS subdomain, at most 253 characters:
one path component) and a device name (a DNS label). The CDI name joins pool and device
with ``_``, which neither may hold, so distinct pairs never meet, and a local device's
``<claim uid>-<device>`` never has one.

A record of the plugin before pool keys (``pool`` None) keeps the names it was prepared
with, ``<claim uid>-<device>`` and ``<claim uid>/<device>/``: its container has those
mounted, so refresh and unprepare after an upgrade must find them there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from composable_dra.lending.remote_leases import is_node_name
from dra_driver import cdi
from dra_driver.checkpoint import PreparedDevice
from dra_driver.claimref import InvalidClaimRef, check_uid

_DEVICE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")


def checked_device(device: str) -> str:
    if _DEVICE.fullmatch(device) is None:
        raise InvalidClaimRef(f"device name {device!r} is not a DNS label")
    return device


def checked_pool(pool: str) -> str:
    if not is_node_name(pool):
        raise InvalidClaimRef(f"pool {pool!r} is not a node name")
    return pool


@dataclass(frozen=True)
class RemoteKey:
    claim_uid: str
    pool: str | None  # None: prepared by a plugin before pool keys
    device: str

    def parts(self) -> tuple[str, ...]:
        """The lease directory's path below the state's (and the container's) root;
        InvalidClaimRef for a name that is not what it should be."""
        uid, device = check_uid(self.claim_uid), checked_device(self.device)
        if self.pool is None:
            return (uid, device)
        return (uid, checked_pool(self.pool), device)

    def cdi_name(self) -> str:
        uid, *rest = self.parts()
        return f"{uid}-{'_'.join(rest)}"

    def cdi_id(self) -> str:
        return cdi.qualified(self.cdi_name())


def recorded_key(claim_uid: str, device: PreparedDevice) -> RemoteKey:
    """The key a checkpointed remote device was prepared under: without the pool when its
    CDI device ID is the one the plugin before pool keys gave it."""
    legacy = device.cdi_device_ids == [cdi.cdi_device_id(claim_uid, device.device_name)]
    return RemoteKey(claim_uid, None if legacy else device.pool_name, device.device_name)
