"""The pure health decisions: which report wins, recovery hysteresis, taints."""

from __future__ import annotations

from composable_dra.model import health_rules as rules
from composable_dra.model.health import Health, HealthReport, Reason


def bad(reason: Reason, device: str = "gpu-a", source: str = "fabric") -> HealthReport:
    return HealthReport(device, Health.UNHEALTHY, reason, source=source)


def ok(device: str = "gpu-a") -> HealthReport:
    return rules.healthy(device, "fabric")


def test_the_worst_report_wins_whatever_the_order() -> None:
    reports = [ok(), bad(Reason.FABRIC_WARNING), bad(Reason.GPU_LOST, source="nvml")]
    for order in (reports, list(reversed(reports))):
        chosen = rules.worst(order)
        assert chosen is not None and chosen.reason is Reason.GPU_LOST
    assert rules.worst([]) is None
    merged = rules.merge([ok("gpu-b"), bad(Reason.XID_ERROR), ok()])
    assert merged["gpu-b"].health is Health.HEALTHY
    assert merged["gpu-a"].reason is Reason.XID_ERROR


def test_bad_news_counts_at_once_recovery_after_n_healthy_reads() -> None:
    state = rules.step(None, bad(Reason.FABRIC_CRITICAL), recover_after=3)
    assert state.report.fatal
    for _ in range(2):
        state = rules.step(state, ok(), recover_after=3)
        assert state.report.reason is Reason.FABRIC_CRITICAL  # still held unhealthy
    state = rules.step(state, ok(), recover_after=3)
    assert state.report.health is Health.HEALTHY


def test_a_relapse_restarts_the_count() -> None:
    state = rules.step(None, bad(Reason.FABRIC_WARNING), recover_after=2)
    state = rules.step(state, ok(), recover_after=2)
    state = rules.step(state, bad(Reason.FABRIC_WARNING), recover_after=2)
    state = rules.step(state, ok(), recover_after=2)
    assert state.report.health is Health.UNHEALTHY
    assert rules.step(state, ok(), recover_after=2).report.health is Health.HEALTHY


def test_step_all_drops_devices_no_longer_observed() -> None:
    prev = {"gpu-a": rules.Debounced(bad(Reason.XID_ERROR))}
    nxt = rules.step_all(prev, {"gpu-b": ok("gpu-b")})
    assert set(nxt) == {"gpu-b"}


def test_taints_no_schedule_when_unhealthy_no_execute_too_when_fatal() -> None:
    assert rules.taints(None) == []
    assert rules.taints(ok()) == []
    assert rules.taints(HealthReport("gpu-a", Health.UNKNOWN)) == []
    warn = rules.taints(bad(Reason.FABRIC_WARNING))
    assert warn == [{"key": rules.TAINT_KEY, "value": "FabricWarning", "effect": "NoSchedule"}]
    fatal = rules.taints(bad(Reason.FABRIC_CRITICAL))
    assert [t["effect"] for t in fatal] == ["NoSchedule", "NoExecute"]
    assert {t["value"] for t in fatal} == {"FabricCritical"}
    assert [t["effect"] for t in rules.taints(bad(Reason.QUARANTINED))] == ["NoSchedule"]
