"""Pure decisions on health reports: which report wins, when a device is healthy again
(hysteresis), and which device taints a state puts in a slice.

The plugin (node devices) and the pool publisher (pool devices) both apply these, so a
device reads the same wherever it is published.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from composable_dra.model.health import Health, HealthReport, Reason

# One key for every health taint; its value is the Reason, so a toleration can pick
# reasons (a diagnostic pod tolerates value Quarantined only).
TAINT_KEY = "composable.dra.io/unhealthy"
NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
# Consecutive healthy reads before a device that was unhealthy counts as healthy again.
RECOVER_AFTER = 3


def _rank(report: HealthReport) -> tuple[int, int]:
    """Worse first: fatal, then unhealthy, then unknown, then healthy."""
    if report.fatal:
        return (0, 0)
    order = {Health.UNHEALTHY: 1, Health.UNKNOWN: 2, Health.HEALTHY: 3}
    return (order[report.health], 0 if report.reason is Reason.QUARANTINED else 1)


def worst(reports: Iterable[HealthReport]) -> HealthReport | None:
    """The report that decides a device's state among several sources' (None: no report)."""
    ranked = sorted(reports, key=lambda r: (_rank(r), r.source, r.reason.value if r.reason else ""))
    return ranked[0] if ranked else None


def merge(reports: Iterable[HealthReport]) -> dict[str, HealthReport]:
    """Per device, the worst report of every source."""
    by_device: dict[str, list[HealthReport]] = {}
    for report in reports:
        by_device.setdefault(report.device, []).append(report)
    out = {}
    for device, group in by_device.items():
        chosen = worst(group)
        if chosen is not None:
            out[device] = chosen
    return out


@dataclass(frozen=True)
class Debounced:
    """A device's published state and how many healthy reads in a row it has seen."""

    report: HealthReport
    healthy_reads: int = 0


def step(
    prev: Debounced | None, observed: HealthReport, recover_after: int = RECOVER_AFTER
) -> Debounced:
    """The next published state: worse news counts at once, a recovery only after
    ``recover_after`` consecutive healthy reads (a flapping block does not flap its pods)."""
    if observed.health is not Health.HEALTHY:
        return Debounced(observed)
    if prev is None or prev.report.health is Health.HEALTHY:
        return Debounced(observed)
    reads = prev.healthy_reads + 1
    if reads >= recover_after:
        return Debounced(observed)
    return Debounced(prev.report, reads)


def step_all(
    prev: Mapping[str, Debounced],
    observed: Mapping[str, HealthReport],
    recover_after: int = RECOVER_AFTER,
) -> dict[str, Debounced]:
    """``step`` for every device observed now; a device no source reports any more (gone
    from the node or the pool) is dropped, and one no source judges reads Healthy."""
    return {
        device: step(prev.get(device), report, recover_after) for device, report in observed.items()
    }


def taints(report: HealthReport | None) -> list[dict[str, str]]:
    """The device taints for a state: NoSchedule when unhealthy, NoExecute too when fatal
    (running pods are evicted, as the DRA device taints design says)."""
    if report is None or report.health is not Health.UNHEALTHY:
        return []
    value = report.reason.value if report.reason else "Unknown"
    out = [{"key": TAINT_KEY, "value": value, "effect": NO_SCHEDULE}]
    if report.fatal:
        out.append({"key": TAINT_KEY, "value": value, "effect": NO_EXECUTE})
    return out


def healthy(device: str, source: str) -> HealthReport:
    return HealthReport(device=device, health=Health.HEALTHY, source=source)


def transitions(prev: Mapping[str, Debounced], nxt: Mapping[str, Debounced]) -> list[HealthReport]:
    """The new states of the devices whose published state changed; a device seen for the
    first time counts only when it is not healthy (its arrival is no health event)."""
    out = []
    for device, state in sorted(nxt.items()):
        before = prev.get(device)
        if before is None:
            if state.report.health is not Health.HEALTHY:
                out.append(state.report)
        elif before.report != state.report:
            out.append(state.report)
    return out


def event_of(report: HealthReport) -> tuple[str, str, str]:
    """(type, reason, message) of the Event for a device's new state (for people)."""
    if report.health is Health.HEALTHY:
        return ("Normal", "DeviceHealthy", f"device {report.device} is healthy again")
    why = report.reason.value if report.reason else report.health.value
    text = f"device {report.device} is {report.health.value}: {why}"
    if report.message:
        text += f" ({report.message})"
    return ("Warning", "DeviceUnhealthy", text)
