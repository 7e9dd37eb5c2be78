"""The health metrics every effect of a health change updates (docs/metrics.md): the plugin
for node devices and the pool publisher for pool devices, labelled by component."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from composable_dra.model.health import Health, HealthReport

TRANSITIONS = Counter(
    "composable_dra_device_health_transitions_total",
    "Devices whose published health changed, by component and the new state's reason",
    ["component", "reason"],
)
UNHEALTHY = Gauge(
    "composable_dra_device_health_unhealthy",
    "Devices published unhealthy now, by component and reason",
    ["component", "reason"],
)


def label(report: HealthReport) -> str:
    """A state's label: its Reason, or the health itself (Healthy, Unknown)."""
    return report.reason.value if report.reason else report.health.value


def record(component: str, changed: Iterable[HealthReport], states: Iterable[HealthReport]) -> None:
    """Count ``changed`` transitions and set the unhealthy gauge from every state now."""
    for report in changed:
        TRANSITIONS.labels(component, label(report)).inc()
    counts: dict[str, int] = {}
    for report in states:
        if report.health is Health.UNHEALTHY:
            counts[label(report)] = counts.get(label(report), 0) + 1
    UNHEALTHY.clear()
    for reason, count in counts.items():
        UNHEALTHY.labels(component, reason).set(count)
