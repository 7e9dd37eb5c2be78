"""Host crowding as a device taint: no new GPU work on a machine already crowded.

GPU jobs on one machine share its PCIe root and host memory, so each one's run time
grows with the traffic of the others (DRMaestro's simulator slows or speeds a task
"based on the task's resource allocation and collocation" with the jobs running on its
machine). DRMaestro's NA policy postpones a placement whose expected time breaks the
job's SLO. Here that becomes a taint like the link-busy one: while a machine's host load
(its GPUs' PCIe traffic over what the host carries) is at or above ``busy_at``, its free
GPUs (its local devices and the remote devices it lends) carry `HOST_BUSY_TAINT`, so a
claim that does not tolerate crowding waits or takes a GPU on a quieter machine, which
lending makes possible. It comes off below ``clear_at`` (`netaware.link_busy`'s
hysteresis).

``busy_at`` follows from the host's slowdown profile, measured offline as DRMaestro
profiles its jobs: how much longer a job runs beside others' traffic that fills the
host. A newcomer adds about what a finished job took away, so a host is busy from the
load whose traffic would slow a co-runner to the claims' QoS tolerance.

Decision code only: no component measures host load or publishes this taint yet
(docs/lending-policy.md says what the plugin would do).
"""

from __future__ import annotations

from composable_dra.lending import netaware

HOST_BUSY_TAINT = "composable.dra.io/host-busy"
HOST_BUSY_EFFECT = "NoSchedule"
# A claim that does not mind crowding (a batch job with no deadline) tolerates the taint.
CROWDING_TOLERATION = {"key": HOST_BUSY_TAINT, "operator": "Exists", "effect": HOST_BUSY_EFFECT}


def crowding_rule(
    tolerance: float, slowdown_at_full: float, clear_ratio: float = 5 / 7
) -> netaware.LinkBusyRule:
    """The thresholds for a host where others' traffic filling it slows a job by
    ``slowdown_at_full`` (0.12: 12% longer), for claims that tolerate ``tolerance`` (0.1).
    Busy from the load that gives the tolerance (at most 1: a host whose full load stays
    inside it is busy only when full); clear at ``clear_ratio`` of it (the product
    default's 0.5 / 0.7)."""
    if tolerance <= 0 or slowdown_at_full <= 0:
        raise netaware.PolicyError(
            f"tolerance and slowdown must be positive, not {tolerance} and {slowdown_at_full}"
        )
    busy_at = min(1.0, tolerance / slowdown_at_full)
    return netaware.LinkBusyRule(busy_at=busy_at, clear_at=busy_at * clear_ratio)


def may_place(tolerates_crowding: bool, host_busy: bool) -> bool:
    """The scheduler's view of the taint."""
    return tolerates_crowding or not host_busy


def device_taint(busy: bool) -> dict[str, str] | None:
    """The taint to publish on a crowded machine's free devices (None when it is not)."""
    if not busy:
        return None
    return {"key": HOST_BUSY_TAINT, "value": "true", "effect": HOST_BUSY_EFFECT}
