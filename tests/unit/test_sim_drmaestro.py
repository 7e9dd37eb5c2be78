"""The simulator drives the product's decisions and runs end to end at a small size."""

from __future__ import annotations

import json

import pytest

from composable_dra.lending import netaware
from hack.sim import drmaestro
from hack.sim.cluster import Cluster, Machine, Policy
from hack.sim.workload import RODINIA, Arrival, JobType


def _cluster(policy: Policy) -> Cluster:
    # Machine 0 has cores and no GPU; machines 1 and 2 lend; 1's link is busy.
    machines = [Machine(8, 0, 100, knee=4), Machine(0, 1, 100, knee=4), Machine(0, 1, 100, 4)]
    cluster = Cluster(machines, policy, netaware.LinkBusyRule(0.3, 0.2))
    machines[1].busy = True
    return cluster


SENSITIVE = next(j for j in RODINIA if j.network_sensitive)
INSENSITIVE = next(j for j in RODINIA if not j.network_sensitive)


@pytest.mark.parametrize(
    ("policy", "job", "donors"),
    [
        (Policy.SERVER_CENTRIC, SENSITIVE, []),
        (Policy.LENDING, SENSITIVE, [1, 2]),
        (Policy.LENDING_NA, SENSITIVE, [2]),
        (Policy.LENDING_NA, INSENSITIVE, [1, 2]),
    ],
)
def test_who_may_borrow_from_a_busy_donor(policy: Policy, job: JobType, donors: list[int]) -> None:
    cluster = _cluster(policy)
    placed = [cluster.place(Arrival(0, job, i)) for i in range(2)]
    assert sorted(r.donor for r in cluster.running if r.donor is not None) == donors
    assert placed.count(True) == len(donors)


def test_the_lease_counter_caps_a_donor() -> None:
    machines = [Machine(64, 0, 100, knee=2), Machine(0, 8, 100, knee=2)]
    cluster = Cluster(machines, Policy.LENDING)
    placed = [cluster.place(Arrival(0, INSENSITIVE, i)) for i in range(4)]
    assert placed == [True, True, False, False]


def test_a_small_run_prints_its_json_last(capsys: pytest.CaptureFixture[str]) -> None:
    code = drmaestro.main(["--jobs", "96", "--machines", "8", "--donors", "4", "--apps", "60"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code in (0, 1) and code == (0 if out["goals_met"] else 1)
    runs = out["policies"]
    assert {r["completed"] for r in runs.values()} == {96}
    assert runs["server-centric"]["remote_jobs"] == 0
    assert runs["lending"]["remote_jobs"] > 0
    assert out["slo_violations"] == 0
    for key in ("makespan_speedup", "qos_violation_ratio", "apps_admitted_ratio"):
        assert key in out and key in out["goals"]
