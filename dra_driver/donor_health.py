"""The donor health source: a remote GPU this node's pods use, as its donor serves it.

A lent GPU's health is its donor's: this node cannot see it. The lease controller
(``device_scaler/leases.py``) can: it marks the claim's remote device ``RemoteGPUFailed``
when the donor is unreachable or refuses (``DonorUnreachable``, ``LeaseRefused``) or no
longer holds the lease and could not open it again (``LeaseLost``: the donor restarted,
and the lease's worker process with it; a re-open that works is ``RemoteGPUReady``).
This source reads that condition on the claims prepared here and reports their remote
devices through the health seam (``health_sources``), so the kubelet shows it in
the pod's ``allocatedResourcesStatus``. A remote device's state is keyed
``<donor>/<device>`` (``model.health.remote_key``): it taints nothing in this node's slice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from composable_dra.lending.remote_leases import REMOTE_FAILED
from composable_dra.model.health import Health, HealthReport, Reason, remote_key
from dra_driver.checkpoint import ClaimRecord
from dra_driver.prepared_remote import remote_claims

SOURCE = "donor"
# The lease controller's failure reasons, as the health reasons users read.
_REASONS = {"LeaseLost": Reason.DONOR_WORKER_CRASHED}


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _failed(claim: dict[str, Any], driver: str, donor: str, device: str) -> dict[str, Any] | None:
    """The device's ``RemoteGPUFailed=True`` condition in the claim's status, if any."""
    status = claim.get("status")
    entries = _dicts(status.get("devices")) if isinstance(status, dict) else []
    for st in entries:
        if (st.get("driver"), st.get("pool"), st.get("device")) != (driver, donor, device):
            continue
        for c in _dicts(st.get("conditions")):
            if c.get("type") == REMOTE_FAILED and c.get("status") == "True":
                return c
    return None


def device_report(claim: dict[str, Any], driver: str, donor: str, device: str) -> HealthReport:
    """The health of one remote device of ``claim``, from its status entry (pure; any JSON)."""
    key = remote_key(donor, device)
    failed = _failed(claim, driver, donor, device)
    if failed is None:
        return HealthReport(key, Health.HEALTHY, source=SOURCE)
    why = str(failed.get("reason") or "")
    reason = _REASONS.get(why, Reason.DONOR_UNREACHABLE)
    message = str(failed.get("message") or why)[:500]
    return HealthReport(key, Health.UNHEALTHY, reason, message, SOURCE)


class DonorHealthSource:
    """Reports the remote devices of the claims prepared here (a ``HealthSource``).

    ``claims`` lists the prepared claims; ``read`` gets a claim (namespace, name) from the
    API: one read per claim with a remote device on each tick, none without."""

    name = SOURCE

    def __init__(
        self,
        driver: str,
        claims: Callable[[], Iterable[ClaimRecord]],
        read: Callable[[str, str], dict[str, Any]],
    ) -> None:
        self._driver, self._claims, self._read = driver, claims, read

    def reports(self) -> list[HealthReport]:
        out: list[HealthReport] = []
        for record, claim in remote_claims(self._claims(), self._read):
            for d in (d for d in record.devices if d.remote is not None):
                out.append(device_report(claim, self._driver, d.pool_name, d.device_name))
        return out
