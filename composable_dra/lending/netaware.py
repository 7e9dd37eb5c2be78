"""The network-aware (NA) policy as a device taint with hysteresis.

A job that uses a GPU over the network becomes sensitive to the load on the links its
traffic crosses (DRMaestro measured up to 80% more time in data transfer beside a
network-heavy job). So a donor whose link is busy has its remote-lease devices tainted
``NoSchedule`` with `LINK_BUSY_TAINT`: claims that are network-sensitive (the default) do
not tolerate the taint and wait, which is DRMaestro's "postpone the placement"; a claim
that declares itself insensitive tolerates it. The taint goes on above ``busy_at`` and
comes off only below ``clear_at``, so a load that hovers at one threshold does not make
the devices flap.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

LINK_BUSY_TAINT = "composable.dra.io/link-busy"
LINK_BUSY_EFFECT = "NoSchedule"
# A network-insensitive claim puts this toleration in its device request (`tolerations`,
# DRA's own field; deploy/examples/remote-insensitive-slo.yaml), so the scheduler itself
# may hand it a busy donor's device.
INSENSITIVE_TOLERATION = {"key": LINK_BUSY_TAINT, "operator": "Exists", "effect": LINK_BUSY_EFFECT}


class PolicyError(ValueError):
    """A link-busy rule whose thresholds cannot work."""


@dataclass(frozen=True)
class LinkBusyRule:
    """Thresholds as fractions of the link's capacity (0..1)."""

    busy_at: float = 0.7
    clear_at: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.clear_at < self.busy_at <= 1.0:
            raise PolicyError(
                f"need 0 < clear_at < busy_at <= 1, not clear_at={self.clear_at} "
                f"busy_at={self.busy_at}"
            )


def link_busy(was_busy: bool, load: float, rule: LinkBusyRule) -> bool:
    """Whether the link counts as busy now, given whether it did at the last look."""
    if was_busy:
        return load > rule.clear_at
    return load >= rule.busy_at


def link_load(bits_per_second: Iterable[float], capacity_bps: float) -> float:
    """The fraction of a link's capacity that the given flows use (capped at 1)."""
    if capacity_bps <= 0:
        raise PolicyError(f"link capacity must be positive, not {capacity_bps}")
    return min(1.0, max(0.0, sum(bits_per_second)) / capacity_bps)


def may_place(network_sensitive: bool, donor_busy: bool) -> bool:
    """The scheduler's view of the taint: insensitive claims tolerate a busy donor."""
    return not (network_sensitive and donor_busy)


def device_taint(busy: bool) -> dict[str, str] | None:
    """The taint to publish on a donor's remote-lease devices (None when the link is fine)."""
    if not busy:
        return None
    return {"key": LINK_BUSY_TAINT, "value": "true", "effect": LINK_BUSY_EFFECT}
