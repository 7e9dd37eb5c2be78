"""The environment a container gets for its claim's remote GPUs: one place for the names.

The plugin writes them (``dra_driver/cdi.py``) and the client library reads them
(``remote_gpu.client.RemoteGPU.from_env`` / ``all_from_env``), so both sides take them
from here. A claim's remote devices are numbered in the order of its allocation's results:
device ``i`` gets ``REMOTE_GPU_<i>_ENDPOINT``, ``REMOTE_GPU_<i>_LEASE`` and
``REMOTE_GPU_<i>_TOKEN_FILE``; device 0 also gets the unsuffixed names that
``RemoteGPU.from_env()`` has always read; and every device sets ``REMOTE_GPUS`` to the
claim's list of indexes (``0,1,2,3``), the same value on each, so merged CDI edits never
conflict.
"""

from __future__ import annotations

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


def names(index: int | None) -> LeaseVars:
    """Lease ``index``'s variable names; None: the unsuffixed ones (the first lease)."""
    prefix = "REMOTE_GPU_" if index is None else f"REMOTE_GPU_{index}_"
    return LeaseVars(f"{prefix}ENDPOINT", f"{prefix}LEASE", f"{prefix}TOKEN_FILE")


def lease_env(index: int, count: int, endpoint: str, lease: int, token_file: str) -> dict[str, str]:
    """The variables lease ``index`` of ``count`` sets in the container."""
    out = {LIST: ",".join(str(i) for i in range(count))}
    for n in (index, None) if index == 0 else (index,):
        v = names(n)
        out |= {v.endpoint: endpoint, v.lease: str(lease), v.token_file: token_file}
    return out


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
