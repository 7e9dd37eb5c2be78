"""The environment a container gets for its claim's remote GPUs: one place for the names.

The plugin writes them (``dra_driver/cdi.py``) and the client library reads them
(``remote_gpu.client.RemoteGPU.from_env`` / ``all_from_env``), so both sides take them
from here. A claim's remote devices are numbered in the order of its allocation's results:
device ``i`` gets ``REMOTE_GPU_<i>_ENDPOINT``, ``REMOTE_GPU_<i>_LEASE`` and
``REMOTE_GPU_<i>_TOKEN_FILE`` and ``REMOTE_GPU_<i>_DIR``; device 0 also gets the
unsuffixed names that ``RemoteGPU.from_env()`` has always read; and every device sets
``REMOTE_GPUS`` to the claim's list of indexes (``0,1,2,3``), the same value on each, so
merged CDI edits never conflict.

``..._DIR`` names the lease's directory, mounted from the plugin's state: it holds
``token`` (the lease's token, the file ``..._TOKEN_FILE`` names) and ``endpoint``
(:func:`endpoint_file`). The plugin replaces both, each by a rename inside the directory,
when the lease is re-opened after its donor restarted; a running container sees the new
files (a mounted directory shows its new entries; a mounted file would keep the old inode),
while the variables keep the values the container started with.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LIST = "REMOTE_GPUS"
MAX_LEASES = 64  # more indexes than any claim can be allocated (a request's count cap)
_INDEXES = re.compile(r"[0-9]{1,2}(,[0-9]{1,2})*")


class RemoteEnvError(ValueError):
    """The remote-GPU variables of a container do not describe its leases."""


@dataclass(frozen=True)
class LeaseVars:
    """The names of one lease's variables."""

    endpoint: str
    lease: str
    token_file: str
    directory: str


def names(index: int | None) -> LeaseVars:
    """Lease ``index``'s variable names; None: the unsuffixed ones (the first lease)."""
    prefix = "REMOTE_GPU_" if index is None else f"REMOTE_GPU_{index}_"
    return LeaseVars(f"{prefix}ENDPOINT", f"{prefix}LEASE", f"{prefix}TOKEN_FILE", f"{prefix}DIR")


# The files of a lease's directory.
TOKEN, ENDPOINT = "token", "endpoint"
_MAX_ENDPOINT_FILE = 4096


def lease_env(index: int, count: int, endpoint: str, lease: int, directory: str) -> dict[str, str]:
    """The variables lease ``index`` of ``count`` sets in the container; ``directory``:
    where the lease's directory is mounted."""
    out = {LIST: ",".join(str(i) for i in range(count))}
    token_file = f"{directory.rstrip('/')}/{TOKEN}"
    for n in (index, None) if index == 0 else (index,):
        v = names(n)
        out |= {v.endpoint: endpoint, v.lease: str(lease), v.token_file: token_file}
        out[v.directory] = directory
    return out


def endpoint_file(endpoint: str, lease: int) -> bytes:
    """The ``endpoint`` file: where the lease is served, and which lease (the reader
    checks it against the token beside it: a pair read mid-refresh does not match)."""
    return json.dumps({"endpoint": endpoint, "lease": lease}).encode()


def read_endpoint_file(data: bytes) -> tuple[str, int]:
    """(endpoint, lease) from an ``endpoint`` file; RemoteEnvError for anything else."""
    if len(data) > _MAX_ENDPOINT_FILE:
        raise RemoteEnvError(f"endpoint file of {len(data)} bytes exceeds {_MAX_ENDPOINT_FILE}")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise RemoteEnvError("endpoint file is not JSON") from None
    endpoint = body.get("endpoint") if isinstance(body, dict) else None
    lease = body.get("lease") if isinstance(body, dict) else None
    if not isinstance(endpoint, str) or not endpoint or len(endpoint) > 512:
        raise RemoteEnvError("endpoint file has no endpoint")
    if not isinstance(lease, int) or isinstance(lease, bool) or not 0 < lease < 1 << 64:
        raise RemoteEnvError("endpoint file has no lease")
    return endpoint, lease


def indexes(env: Mapping[str, str]) -> Sequence[int | None]:
    """The leases ``env`` describes: ``REMOTE_GPUS``'s indexes, or ``[None]`` (the
    unsuffixed names alone, from a plugin before several leases), or none at all."""
    listed = env.get(LIST)
    if listed is None:
        return [None] if names(None).endpoint in env else []
    if not _INDEXES.fullmatch(listed):
        raise RemoteEnvError(f"{LIST}={listed[:80]!r} is not a comma-separated list of indexes")
    out = [int(i) for i in listed.split(",")]
    if len(set(out)) != len(out) or max(out) >= MAX_LEASES:
        raise RemoteEnvError(f"{LIST}={listed!r} repeats an index or exceeds {MAX_LEASES}")
    return out
