"""The claims prepared here that hold remote devices, each with what the API says of it now.

What the donor health source and the lease refresher both read: for each prepared claim
with a remote device, the claim as it is now, skipping one that is gone (its unprepare is
on the way) or that is another claim by the same name (this one is going).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from dra_driver.checkpoint import ClaimRecord
from dra_driver.prepare import ClaimNotFound

ClaimRead = Callable[[str, str], dict[str, Any]]


def remote_claims(
    records: Iterable[ClaimRecord], read: ClaimRead
) -> Iterator[tuple[ClaimRecord, dict[str, Any]]]:
    """(record, claim now) for each of ``records`` with a remote device; one API read each."""
    for record in records:
        if not any(d.remote is not None for d in record.devices):
            continue
        try:
            claim = read(record.namespace, record.name)
        except ClaimNotFound:
            continue
        if (claim.get("metadata") or {}).get("uid") == record.uid:
            yield record, claim
