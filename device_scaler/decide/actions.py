"""What the decision returns: the writes the scaler makes, one type each."""

from __future__ import annotations

from dataclasses import dataclass, field

from api.v1alpha1 import ClaimRef
from composable_dra.k8s.kube import JSON


@dataclass(frozen=True)
class CreateResource:
    """Create a ComposableResource: the operator attaches ``device`` for ``claim``."""

    name: str
    body: JSON
    claim: ClaimRef | None  # None: a warm standby GPU
    device: str


@dataclass(frozen=True)
class SetDeviceStatus:
    """Write the claim's ``status.devices`` entries: its pool devices' conditions."""

    claim: ClaimRef
    entries: list[JSON]
    ready: list[tuple[str, float | None]] = field(default_factory=list)  # device, since alloc
    failed: list[tuple[str, str, str]] = field(default_factory=list)  # device, reason, message
    version: str = ""  # the resourceVersion of the claim it was decided on


@dataclass(frozen=True)
class ResourceChange:
    """A change to a ComposableResource the scaler owns, and why: ``reason`` (one word)
    and ``message`` (for people), which the scaler logs with it."""

    name: str
    reason: str
    message: str = ""


@dataclass(frozen=True)
class DeleteResource(ResourceChange):
    """Delete the resource: the operator detaches its GPU."""


@dataclass(frozen=True)
class PatchResource(ResourceChange):
    """A metadata/spec merge patch of the resource."""

    patch: JSON = field(kw_only=True)


@dataclass(frozen=True)
class Quarantine:
    """Taint a pool device whose attach failed NoSchedule (a DeviceTaintRule) ``until``."""

    pool: str
    device: str
    until: float


@dataclass(frozen=True)
class Unquarantine:
    """Delete the quarantine DeviceTaintRule ``rule``: its time is up."""

    rule: str


Action = (
    CreateResource | SetDeviceStatus | DeleteResource | PatchResource | Quarantine | Unquarantine
)
