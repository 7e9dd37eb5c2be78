"""A GPU's health as every source reports it and every effect reads it.

The sources (NVML on the node, the fabric's Redfish ``Status`` or Fsas status, the donor
of a lent GPU) each turn what they see into a ``HealthReport``; the effects (device
taints in slices, the kubelet's health stream, detach and quarantine, metrics and Events)
read only this model, so a new source needs no new effect and the reason a user reads is
the same wherever it shows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Health(enum.Enum):
    """The kubelet's three states (``dra-health/v1`` ``HealthStatus``)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class Reason(enum.Enum):
    """Why a GPU is unhealthy: a CamelCase word users see in taints, Events and metrics."""

    XID_ERROR = "XidError"
    ECC_ERROR = "EccError"
    GPU_LOST = "GpuLost"
    FABRIC_CRITICAL = "FabricCritical"
    FABRIC_WARNING = "FabricWarning"
    FABRIC_ABSENT = "FabricAbsent"
    DONOR_UNREACHABLE = "DonorUnreachable"
    DONOR_WORKER_CRASHED = "DonorWorkerCrashed"
    QUARANTINED = "Quarantined"


# Faults after which the GPU cannot serve a running pod: the pod is evicted
# (NoExecute) as well as kept from new pods (NoSchedule).
FATAL = frozenset({Reason.GPU_LOST, Reason.FABRIC_ABSENT, Reason.FABRIC_CRITICAL})


@dataclass(frozen=True)
class HealthReport:
    """One source's view of one device at one moment."""

    device: str  # the device's name in its slice
    health: Health
    reason: Reason | None = None
    message: str = ""
    source: str = ""  # "nvml", "fabric", "donor", "manual"

    @property
    def fatal(self) -> bool:
        return self.health is Health.UNHEALTHY and self.reason in FATAL


def remote_key(donor: str, device: str) -> str:
    """A lent GPU's name on its consumer's health board (``dra_driver.donor_health``):
    ``<donor>/<device>``, never a local device's name, so it taints nothing there."""
    return f"{donor}/{device}"
