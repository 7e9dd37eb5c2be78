"""Per-claim QoS placement: DRMaestro's NA policy as each claim's own device selector.

DRMaestro postpones a placement whose expected time breaks *that job's* SLO, job by job.
A taint is one threshold for every claim. Here each device publishes what a job's
expected time there depends on, and each claim's selector (CEL, which kube-scheduler
evaluates) says which values its own profile can bear:

- ``hostSlowdown``: how much longer a job runs on this device's machine now, from the
  GPU traffic of the jobs already there (per mille). The node turns its measured host
  load into it with its host profile (`HostProfile`), so claims need not know the node.
- ``linkLoad``: on a remote device, the load on its donor's link (per mille); a remote
  job's transfer part is stretched ``1 / (1 - linkLoad)``.
- ``hostHeadroom``: the host load that may still be added before a job already running
  there with a declared profile breaks its own tolerance (per mille; 1000 when none has).
  One free device of a machine carries it; the others publish none (`closed`), so that
  claims placed before the next publication cannot share it.

A claim's `QosProfile` is what DRMaestro profiles offline for a job: the time a remote
GPU adds on an idle link, its tolerance, and the host load it adds. It fits a device when
its expected slowdown there stays inside its tolerance and its load inside the headroom
(`fits`); `cel_selector` writes the same test for the scheduler, over the published
integers (`published`), so the plugin, the scheduler and the simulator decide alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from api.labels import DNS_SUBDOMAIN_RE

HOST_SLOWDOWN = "hostSlowdown"
LINK_LOAD = "linkLoad"
HEADROOM = "hostHeadroom"
SCALE = 1000  # attributes are integers: per mille
# Published link load stops here: past it the 1 / (1 - load) stretch means "saturated",
# and no profile's budget survives it anyway.
MAX_LINK_LOAD = 950
# Attributes move in steps this large (per mille), so a device's slice is rewritten when a
# value moves a step, not on every sample.
STEP = 25


class ProfileError(ValueError):
    """A profile whose numbers cannot describe a job or a host."""


class SelectorError(ValueError):
    """A selector that cannot be written for the domain asked for."""


@dataclass(frozen=True)
class HostProfile:
    """A machine's interference profile, measured offline: a job runs
    ``slowdown_at_full`` longer beside others' GPU traffic that fills the host."""

    slowdown_at_full: float

    def __post_init__(self) -> None:
        if not 0.0 < self.slowdown_at_full <= 10.0:
            raise ProfileError(f"slowdown_at_full must be in (0, 10], not {self.slowdown_at_full}")


@dataclass(frozen=True)
class QosProfile:
    """One job's profile: ``transfer``, the time a remote GPU adds on an idle link as a
    fraction of its local run; ``tolerance``, how much past its placement's expected time
    it may run; ``host_load``, the share of a host's PCIe/memory bandwidth it adds."""

    transfer: float
    tolerance: float
    host_load: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.transfer <= 10.0:
            raise ProfileError(f"transfer must be in [0, 10], not {self.transfer}")
        if not 0.0 < self.tolerance <= 10.0:
            raise ProfileError(f"tolerance must be in (0, 10], not {self.tolerance}")
        if not 0.0 <= self.host_load <= 1.0:
            raise ProfileError(f"host_load must be in [0, 1], not {self.host_load}")

    def budget(self, remote: bool) -> float:
        """The slowdown it may take, as a fraction of the local run: its tolerance of
        its placement's expected time (which includes the idle-link transfer if remote)."""
        return self.tolerance * (1.0 + (self.transfer if remote else 0.0))


@dataclass(frozen=True)
class DeviceLoad:
    """What a device publishes, as fractions: ``link_load`` is None on a local device."""

    host_slowdown: float
    link_load: float | None
    headroom: float


def host_slowdown(host_load: float, host: HostProfile) -> float:
    """The slowdown that a machine's GPU traffic (``host_load`` of its capacity) gives a
    job placed there now."""
    return host.slowdown_at_full * min(1.0, max(0.0, host_load))


def expected_slowdown(p: QosProfile, d: DeviceLoad) -> float:
    """How much longer than its local run ``p`` would take on device ``d`` beyond its
    placement's expected time (same unit as `QosProfile.budget`)."""
    slowdown = d.host_slowdown
    if d.link_load is not None:
        load = min(d.link_load, MAX_LINK_LOAD / SCALE)
        slowdown += p.transfer / (1.0 - load) - p.transfer
    return slowdown


def fits(p: QosProfile, d: DeviceLoad) -> bool:
    """Whether ``p`` may be placed on ``d``: its own expected time holds, and its load
    breaks no running job's tolerance."""
    return expected_slowdown(p, d) <= p.budget(d.link_load is not None) and (
        p.host_load <= d.headroom
    )


def headroom(
    host_load: float, running: Iterable[tuple[QosProfile, bool]], host: HostProfile
) -> float:
    """The host load that may still be added before one of ``running`` (profile, remote)
    on this machine breaks its tolerance: a job is slowed by the others' load, ``host_load``
    less its own, and may take ``budget`` of it."""
    room = 1.0
    for p, remote in running:
        others = max(0.0, host_load - p.host_load)
        room = min(room, p.budget(remote) / host.slowdown_at_full - others)
    return max(0.0, room)


def closed(d: DeviceLoad, host: HostProfile) -> DeviceLoad:
    """What a machine's other devices publish while one free device carries its load
    ``d``: no headroom, and the slowdown with that headroom taken.

    The scheduler does not see attributes change between pods: had every free device
    offered ``d``, it could hand several claims the same headroom before the next
    publication, and they would slow each other and the jobs running there. With one
    device open, a machine takes at most one claim that adds load per publication, and
    that claim sees the load its profile was checked against."""
    taken = d.host_slowdown + host.slowdown_at_full * d.headroom
    return DeviceLoad(min(host.slowdown_at_full, taken), d.link_load, 0.0)


def published(d: DeviceLoad) -> dict[str, int]:
    """The attributes to publish, per mille in steps of `STEP`, each rounded to the safe
    side: slowdown and load up, headroom down."""

    def up(x: float) -> int:
        return min(SCALE, math.ceil(round(x * SCALE / STEP, 6)) * STEP)

    out = {
        HOST_SLOWDOWN: up(d.host_slowdown),
        HEADROOM: math.floor(d.headroom * SCALE / STEP) * STEP,
    }
    if d.link_load is not None:
        out[LINK_LOAD] = min(MAX_LINK_LOAD, up(d.link_load))
    return out


def as_published(d: DeviceLoad) -> DeviceLoad:
    """``d`` as the scheduler sees it once published (`published`, read back)."""
    a = published(d)
    link = a.get(LINK_LOAD)
    return DeviceLoad(
        host_slowdown=a[HOST_SLOWDOWN] / SCALE,
        link_load=None if link is None else link / SCALE,
        headroom=a[HEADROOM] / SCALE,
    )


def cel_selector(p: QosProfile, domain: str) -> str:
    """`fits` as a CEL device selector over the published attributes of ``domain``, the
    driver that publishes them: what a claim puts in its request's ``selectors`` so the
    scheduler applies its profile. A device of that driver that publishes no load (a pool
    device not yet attached) is not refused; a device of any other driver is, so that a
    mistyped domain matches no device rather than every one (a domain without attributes
    reads as empty). SelectorError when ``domain`` is not a driver name: it is written
    into the expression, where a quote or a backslash would change it."""
    if len(domain) > 63 or not DNS_SUBDOMAIN_RE.fullmatch(domain):
        raise SelectorError(
            f"driver name {domain!r} is not a DRA driver name (a DNS subdomain of at most "
            "63 characters)"
        )
    a = f'device.attributes["{domain}"]'
    host = f"double({a}.{HOST_SLOWDOWN}) / {SCALE}.0"
    link = f"({p.transfer!r} / (1.0 - double({a}.{LINK_LOAD}) / {SCALE}.0) - {p.transfer!r})"
    remote = f"({host} + {link} <= {p.budget(True)!r})"
    local = f"({host} <= {p.budget(False)!r})"
    need = math.ceil(round(p.host_load * SCALE, 6))
    return (
        f'device.driver == "{domain}" && (!("{HOST_SLOWDOWN}" in {a}) || ('
        f'("{LINK_LOAD}" in {a} ? {remote} : {local}) && {a}.{HEADROOM} >= {need}))'
    )
