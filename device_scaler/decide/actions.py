"""What the decision returns: the writes the scaler makes, one type each."""

from __future__ import annotations

from dataclasses import dataclass, field

from api.v1alpha1 import ClaimRef
from composable_dra.k8s.kube import JSON


@dataclass(frozen=True)
class CreateResource:
    name: str
    body: JSON
    claim: ClaimRef | None  # None: a warm standby GPU
    device: str


@dataclass(frozen=True)
class SetDeviceStatus:
    claim: ClaimRef
    entries: list[JSON]
    ready: list[tuple[str, float | None]] = field(default_factory=list)  # device, since alloc
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # device, reason, message


@dataclass(frozen=True)
class DeleteResource:
    name: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class PatchResource:
    """A metadata/spec merge patch of a resource the scaler owns."""

    name: str
    patch: JSON
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Quarantine:
    pool: str
    device: str
    until: float


@dataclass(frozen=True)
class Unquarantine:
    rule: str


Action = (
    CreateResource | SetDeviceStatus | DeleteResource | PatchResource | Quarantine | Unquarantine
)
