"""What the decision reads: the scaler's settings and one snapshot of the cluster."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from device_scaler import standby as sb


@dataclass(frozen=True)
class ScalerSettings:
    driver: str = names.DRIVER
    attach_timeout: float = 300.0
    no_removal: float = 600.0
    quarantine: float = 60.0
    fail_on_fabric_error: bool = True


@dataclass(frozen=True)
class ScalerSnapshot:
    now: float
    claims: list[JSON]
    resources: list[JSON]
    # (pool, device) -> the device entry, for every device of our driver's fabric pools.
    pool_devices: Mapping[tuple[str, str], JSON]
    # (node, normalized uuid) -> local device name, from the nodes' own slices.
    local_devices: Mapping[tuple[str, str], str]
    requests: list[JSON] = field(default_factory=list)
    quarantines: list[JSON] = field(default_factory=list)
    standby: sb.StandbyInputs = field(default_factory=sb.StandbyInputs)
