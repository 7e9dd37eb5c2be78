"""device_scaler.pool_gauges: the counts behind the pool's gauges, and what a pass sets."""

from __future__ import annotations

from prometheus_client import REGISTRY

from composable_dra.k8s.kube import JSON
from device_scaler import pool_gauges as pg

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def cr(phase: str | None, created: str = "2027-01-15T07:59:00Z", deleted: str = "") -> JSON:
    meta: JSON = {"name": "r", "creationTimestamp": created}
    if deleted:
        meta["deletionTimestamp"] = deleted
    return {"metadata": meta, "status": {"phase": phase} if phase else {}}


def test_every_phase_is_counted_and_a_new_resource_is_attaching() -> None:
    counts = pg.phase_counts([cr(None), cr("Attaching"), cr("Online")])
    assert counts == {"Attaching": 2, "Online": 1, "Detaching": 0, "Detached": 0, "Failed": 0}


def test_oldest_transient_ages_from_creation_or_from_deletion() -> None:
    resources = [
        cr("Attaching", created="2027-01-15T07:58:00Z"),
        cr("Attaching", created="2027-01-15T07:59:30Z"),
        # Created long ago, deleted 20 s ago: detaching for 20 s.
        cr("Detaching", created="2027-01-01T00:00:00Z", deleted="2027-01-15T07:59:40Z"),
        cr("Online", created="2020-01-01T00:00:00Z"),
    ]
    assert pg.oldest_transient(resources, NOW) == {"Attaching": 120.0, "Detaching": 20.0}
    assert pg.oldest_transient([], NOW) == {"Attaching": 0.0, "Detaching": 0.0}


def test_quarantines_are_counted_by_pool_and_pending_claims_have_no_allocation() -> None:
    rules: list[JSON] = [
        {"spec": {"deviceSelector": {"pool": "fab/z1", "device": "a"}}},
        {"spec": {"deviceSelector": {"pool": "fab/z1", "device": "b"}}},
        {"spec": {"deviceSelector": {"pool": "fab/z2", "device": "c"}}},
        {"spec": {}},
    ]
    assert pg.quarantined_by_pool(rules) == {"fab/z1": 2, "fab/z2": 1}
    pending = pg.PendingClaims()

    def claim(name: str, status: JSON | None) -> JSON:
        return {"metadata": {"name": name, "namespace": "ns"}, "status": status}

    allocated: JSON = {"allocation": {"devices": {}}}
    for name, status in [("a", {}), ("b", None), ("c", allocated)]:
        pending.event("ADDED", claim(name, status))
    assert len(pending) == 2
    pending.event("MODIFIED", claim("a", allocated))
    pending.event("DELETED", claim("b", None))
    assert len(pending) == 0
    pending.event("MODIFIED", claim("c", None))  # its allocation went away
    assert len(pending) == 1


def test_publish_sets_the_gauges_and_drops_a_pool_whose_quarantine_ended() -> None:
    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    rule = {"spec": {"deviceSelector": {"pool": "fab/zq", "device": "a"}}}
    pg.publish([cr("Attaching")], [rule], 1, NOW)
    assert sample("composable_dra_composable_resources", phase="Attaching") == 1
    assert sample("composable_dra_composable_resources", phase="Failed") == 0
    assert sample("composable_dra_composable_resource_oldest_seconds", phase="Attaching") == 60
    assert sample("composable_dra_scaler_quarantined_devices", pool="fab/zq") == 1
    assert sample("composable_dra_scaler_claims_pending") == 1
    pg.publish([], [], 0, NOW)
    assert sample("composable_dra_scaler_quarantined_devices", pool="fab/zq") is None
    assert sample("composable_dra_composable_resources", phase="Attaching") == 0
