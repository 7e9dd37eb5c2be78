"""Prepare a remote GPU on the consumer node: its lease's credentials, in a directory.

A claim allocated a donor's ``<gpu>-remote`` device carries, once the lease controller
opened the lease, ``RemoteGPUReady`` with ``data`` = {donor, endpoint, lease} on that
device. Prepare asks the donor's lease API for the lease's token (proving this node with
its pod's projected service-account token, bound to the pod) and writes it with
the lease's endpoint into the device's directory under the plugin's state directory,
``<claim uid>/<pool>/<device>/`` (``remote_key``: two donors lend the same device names);
the CDI spec mounts that directory read-only and gives the container ``REMOTE_GPU_DIR``,
``REMOTE_GPU_ENDPOINT``, ``REMOTE_GPU_LEASE`` and ``REMOTE_GPU_TOKEN_FILE``: what
``RemoteGPU.from_env()`` reads. When the lease controller re-opens the lease (its donor
restarted), :func:`stale_leases` finds it and the files are replaced in the directory,
which a running container sees. Unprepare removes the
directory and closes the lease at the donor.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from composable_dra.lending.remote_leases import (
    REMOTE_READY,
    REMOTE_SUFFIX,
    LeaseAPIError,
    LeaseClient,
    allocation_node,
    is_node_name,
)
from composable_dra.model import remote_env
from composable_dra.process import logs
from dra_driver.checkpoint import PreparedDevice
from dra_driver.claimref import InvalidClaimRef
from dra_driver.fsutil import atomic_write
from dra_driver.remote_key import RemoteKey

log = logs.get(__name__)

CONTAINER_DIR = "/var/run/composable-dra/remote-gpu"


class RemoteClaimError(Exception):
    """What keeps one claim's remote device from being prepared (reported for it)."""


@dataclass(frozen=True)
class RemotePlanned:
    request: str
    donor: str  # the pool: the donor's node
    device: str
    endpoint: str
    lease: int


def is_remote(result: dict[str, Any], node_name: str) -> bool:
    """A lent device of another node's pool, not one of this node's or a fabric pool's."""
    pool, device = str(result.get("pool", "")), str(result.get("device", ""))
    return device.endswith(REMOTE_SUFFIX) and pool != node_name and is_node_name(pool)


def _lease_data(claim: dict[str, Any], driver: str, pool: str, device: str) -> tuple[str, int]:
    for st in (claim.get("status") or {}).get("devices") or []:
        if (st.get("driver"), st.get("pool"), st.get("device")) != (driver, pool, device):
            continue
        ready = any(
            c.get("type") == REMOTE_READY and c.get("status") == "True"
            for c in st.get("conditions") or []
        )
        data = st.get("data") or {}
        endpoint, lease = data.get("endpoint"), data.get("lease")
        if ready and isinstance(endpoint, str) and isinstance(lease, int) and lease > 0:
            return endpoint, lease
    raise RemoteClaimError(f"remote device {pool}/{device} has no ready lease in the claim status")


def plan_remote(claim: dict[str, Any], driver: str, node_name: str) -> list[RemotePlanned]:
    """The claim's remote devices this node prepares, with their leases."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    out: list[RemotePlanned] = []
    for r in (allocation.get("devices") or {}).get("results") or []:
        if r.get("driver") != driver or not is_remote(r, node_name):
            continue
        if allocation_node(allocation) != node_name:
            raise RemoteClaimError(f"remote device {r['device']} is allocated to another node")
        pool, device = str(r["pool"]), str(r["device"])
        endpoint, lease = _lease_data(claim, driver, pool, device)
        out.append(RemotePlanned(str(r.get("request", "")), pool, device, endpoint, lease))
    return out


def stale_leases(
    devices: Sequence[PreparedDevice], claim: dict[str, Any], driver: str
) -> list[RemotePlanned]:
    """The remote devices prepared here whose claim now names another ready lease (the
    lease controller re-opened it after its donor restarted), with the new lease. A
    device whose status has no ready lease (the donor is down, or failed) is not stale:
    there is nothing newer to fetch."""
    out: list[RemotePlanned] = []
    for d in devices:
        if d.remote is None:
            continue
        try:
            endpoint, lease = _lease_data(claim, driver, d.pool_name, d.device_name)
        except RemoteClaimError:
            continue
        if (endpoint, lease) != (d.remote.endpoint, d.remote.lease):
            request = d.request_names[0] if d.request_names else ""
            out.append(RemotePlanned(request, d.pool_name, d.device_name, endpoint, lease))
    return out


def _below(top: Path, directory: Path) -> list[Path]:
    """The directories from just below ``top`` down to ``directory``."""
    parts = directory.relative_to(top).parts
    return [top.joinpath(*parts[: i + 1]) for i in range(len(parts))]


def container_lease_dir(key: RemoteKey) -> str:
    """Where the device's lease directory is mounted in the container (per claim and
    pool: two claims, or two donors of one claim, may each have a ``gpu-0-remote``)."""
    return "/".join((CONTAINER_DIR, *key.parts()))


class RemoteLeases:
    """Credentials in and out: a directory per claim, pool and device under
    ``token_dir``, named from checked names."""

    def __init__(self, client: LeaseClient, token_dir: Path, durable: bool = True) -> None:
        self.client = client
        self.token_dir = token_dir
        self.durable = durable

    def lease_dir(self, key: RemoteKey) -> Path:
        """``<token_dir>/<claim uid>/<pool>/<device>``; InvalidClaimRef for names that
        would lead elsewhere."""
        path = self.token_dir.joinpath(*key.parts())
        if os.path.abspath(path) != os.path.join(os.path.abspath(self.token_dir), *key.parts()):
            raise InvalidClaimRef(f"{key} leads outside {self.token_dir}")
        return path

    def token_path(self, key: RemoteKey) -> Path:
        return self.lease_dir(key) / remote_env.TOKEN

    def fetch(self, key: RemoteKey, planned: RemotePlanned) -> Path:
        """Collect the lease's token from its donor and write it and the lease's endpoint
        into the device's directory, each replaced by a rename inside it (the token first:
        a reader pairs them by lease, see ``remote_env``).

        The files are for the container's user, whoever that is (the product image runs as
        10001, a pod chooses its own): readable by all (0444, as a projected
        service-account token is 0644), in a directory all may enter. The host is kept out
        by ``token_dir``, root's alone (0700); a container sees only its own directories."""
        directory = self.lease_dir(key)
        try:
            token = self.client.credentials(planned.donor, planned.lease)
        except LeaseAPIError as exc:
            raise RemoteClaimError(
                f"donor {planned.donor} refused lease {planned.lease}'s credentials: {exc}"
            ) from None
        if token.get("lease") != planned.lease:
            raise RemoteClaimError(f"donor {planned.donor} sent another lease's credentials")
        self.token_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.token_dir, 0o700)  # also where an older plugin made it otherwise
        directory.mkdir(parents=True, exist_ok=True)
        for part in _below(self.token_dir, directory):  # whatever the umask
            os.chmod(part, 0o755)  # noqa: S103 - for any container user; token_dir keeps the host out
        body = json.dumps(token).encode()
        atomic_write(directory / remote_env.TOKEN, body, mode=0o444, durable=self.durable)
        endpoint = remote_env.endpoint_file(planned.endpoint, planned.lease)
        atomic_write(directory / remote_env.ENDPOINT, endpoint, mode=0o444, durable=self.durable)
        return directory

    def release(self, held: Sequence[tuple[RemoteKey, str, int]]) -> None:
        """Remove the token files of (key, donor, lease) and close the leases; a donor
        that cannot be reached is left to the lease controller, which closes the lease
        once the claim is deallocated."""
        for key, donor, lease in held:
            directory = self.lease_dir(key)
            shutil.rmtree(directory, ignore_errors=True)
            self._prune(directory.parent)
            try:
                self.client.close(donor, lease)
            except LeaseAPIError as exc:
                log.warning(
                    "cannot close a lease at its donor", donor=donor, lease=lease, error=str(exc)
                )

    def _prune(self, directory: Path) -> None:
        """Remove ``directory`` and its parents below ``token_dir`` while they are empty
        (the pool's, then the claim's)."""
        top = os.path.abspath(self.token_dir)
        while os.path.abspath(directory).startswith(top + os.sep):
            with contextlib.suppress(OSError):  # not empty (or gone): leave it
                directory.rmdir()
            if directory.exists():
                return
            directory = directory.parent
