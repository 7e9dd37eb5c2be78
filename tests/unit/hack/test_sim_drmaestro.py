"""The simulator drives the product's decisions and runs end to end at a small size."""

from __future__ import annotations

import json

import pytest

from composable_dra.lending import netaware, qos
from hack.sim import drmaestro
from hack.sim.cluster import Cluster, Finished, Machine, Policy
from hack.sim.workload import (
    BACKGROUND,
    RODINIA,
    SATURATED_STRETCH,
    TOLERANCE,
    Arrival,
    JobType,
)


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
    assert runs["lending-qos"]["remote_jobs"] > 0
    # The goals measure the per-claim selectors; the taints' figures stand beside them.
    base = runs["server-centric"]
    assert out["qos_violation_ratio"] == drmaestro.violation_ratio(base, runs["lending-qos"])
    assert out["makespan_speedup"] == drmaestro.makespan_speedup(base, runs["lending-qos"])
    assert out["qos_violation_ratio_with_taints"] == drmaestro.violation_ratio(
        base, runs["lending-na-host"]
    )
    assert out["slo_violations"] == 0
    for key in ("makespan_speedup", "qos_violation_ratio", "apps_admitted_ratio"):
        assert key in out and key in out["goals"]
    for run in runs.values():
        assert sum(run["qos_violations_by_cause"].values()) == run["qos_violations"]


def _run_alone(cluster: Cluster, arrival: Arrival, host: int, donor: int | None) -> float:
    """Start ``arrival`` on ``host`` (GPU on ``donor``) and step until it ends: its run time."""
    cluster._start(arrival, host, donor)
    for _ in range(10_000):
        if not any(r.arrival.index == arrival.index for r in cluster.running):
            break
        cluster.step(1.0)
    (done,) = [f for f in cluster.finished if f.arrival.index == arrival.index]
    return done.end - done.start


@pytest.mark.parametrize(("name", "loaded_share"), [("nw", 0.49), ("hotspot", 0.01)])
def test_a_saturated_path_stretches_transfers_as_drmaestro_measured(
    name: str, loaded_share: float
) -> None:
    """Fig. 3: beside Iperf, NW's transfer share went from 17% to 49%, HotSpot's from
    0.2% to 1%. An Iperf-like job on the consumer's machine must give the same shares."""
    job = JobType(**{**next(j for j in RODINIA if j.name == name).__dict__, "base_s": 2000})
    machines = [Machine(8, 0, 100, knee=4), Machine(0, 1, 100, knee=4)]
    cluster = Cluster(machines, Policy.LENDING, colo=0.0)
    cluster._start(Arrival(0, BACKGROUND_LONG, -1), 0, None)
    run_s = _run_alone(cluster, Arrival(0, job, 1), host=0, donor=1)
    share = (run_s - job.base_s) / run_s
    assert share == pytest.approx(loaded_share, rel=0.06)


BACKGROUND_LONG = JobType(**{**BACKGROUND.__dict__, "base_s": 100_000})


def test_a_network_heavy_job_slows_only_transfers_that_cross_its_link() -> None:
    # A local GPU job beside Iperf: no transfer, so no slowdown (Fig. 3 puts it all there).
    cluster = Cluster([Machine(8, 1, 100, knee=4)], Policy.LENDING, colo=0.0)
    cluster._start(Arrival(0, BACKGROUND_LONG, -1), 0, None)
    job = next(j for j in RODINIA if j.name == "nw")
    assert _run_alone(cluster, Arrival(0, job, 1), host=0, donor=None) == pytest.approx(
        job.base_s, abs=1.0
    )


def test_a_qos_violation_is_run_time_over_expected_not_waiting() -> None:
    job = next(j for j in RODINIA if j.name == "nw")
    waited = Finished(Arrival(0, job, 1), 900, 900 + job.base_s, False, job.base_s, "host")
    assert not waited.violated(TOLERANCE)
    assert waited.violated_with_wait(TOLERANCE)
    slowed = Finished(Arrival(0, job, 2), 0, job.base_s * 1.2, False, job.base_s, "host")
    assert slowed.violated(TOLERANCE)


def test_sensitivity_and_the_na_threshold_follow_from_the_qos_tolerance() -> None:
    """A job is sensitive when a saturated path would break its QoS; a donor is busy from
    the load at which the most network-bound sensitive job just reaches its tolerance."""
    for job in RODINIA:
        extra = job.net_frac * (SATURATED_STRETCH - 1)
        assert job.network_sensitive == (extra > TOLERANCE * (1 + job.net_frac))
    assert {j.name for j in RODINIA if not j.network_sensitive} == {"hotspot", "lavamd"}
    rule = drmaestro.na_rule(RODINIA, TOLERANCE)
    worst = max(j.net_frac for j in RODINIA if j.network_sensitive)
    assert worst / (1 - rule.busy_at) - worst == pytest.approx(TOLERANCE * (1 + worst))
    assert 0 < rule.clear_at < rule.busy_at


def test_a_looser_tolerance_makes_fewer_jobs_sensitive_and_a_later_taint() -> None:
    strict = {j.name for j in RODINIA if j.is_sensitive(0.05)}
    loose = {j.name for j in RODINIA if j.is_sensitive(0.20)}
    assert loose < strict
    assert drmaestro.na_rule(RODINIA, 0.20).busy_at > drmaestro.na_rule(RODINIA, 0.05).busy_at


def _job(name: str, base_s: float = 2000) -> JobType:
    return JobType(**{**next(j for j in RODINIA if j.name == name).__dict__, "base_s": base_s})


def test_co_runners_slow_a_job_by_their_data_rate_on_its_gpus_machine() -> None:
    """DRMaestro: a task's time changes with the jobs running on its machine. Here each
    co-running GPU job adds ``colo`` x its pressure (its data rate over the mix's mean)."""
    heavy, light = _job("nw", 100_000), _job("hotspot", 100_000)
    for neighbour in (heavy, light):
        cluster = Cluster([Machine(16, 4, 100, knee=4)], Policy.SERVER_CENTRIC, colo=0.05)
        for i in range(3):
            cluster._start(Arrival(0, neighbour, -1 - i), 0, None)
        job = _job("srad")
        run_s = _run_alone(cluster, Arrival(0, job, 1), host=0, donor=None)
        assert run_s == pytest.approx(job.base_s * (1 + 0.05 * 3 * neighbour.pressure), rel=0.01)
    assert heavy.pressure > 1 > light.pressure
    assert sum(j.pressure for j in RODINIA) == pytest.approx(len(RODINIA))


@pytest.mark.parametrize(("pod_side", "slowed"), [(False, False), (True, True)])
def test_a_crowded_pod_host_slows_a_remote_job_only_when_the_pod_side_counts(
    pod_side: bool, slowed: bool
) -> None:
    machines = [Machine(16, 4, 100, knee=4), Machine(0, 1, 100, knee=4)]
    cluster = Cluster(machines, Policy.LENDING, colo=0.05, pod_side=pod_side)
    for i in range(3):
        cluster._start(Arrival(0, _job("nw", 100_000), -1 - i), 0, None)
    job = _job("hotspot")
    run_s = _run_alone(cluster, Arrival(0, job, 1), host=0, donor=1)
    # Its transfer on links that the local jobs leave idle, and no host slowdown at the donor.
    alone = job.base_s * (1 + job.net_frac)
    assert (run_s > alone * 1.05) is slowed


def test_the_host_busy_taint_keeps_gpu_jobs_off_a_crowded_machine() -> None:
    machines = [Machine(16, 4, 100, knee=4), Machine(16, 4, 100, knee=4)]
    rule = netaware.LinkBusyRule(busy_at=0.5, clear_at=0.3)
    job = _job("srad")
    for policy, hosts in ((Policy.SERVER_CENTRIC, {0}), (Policy.SERVER_CENTRIC_HOST, {1})):
        cluster = Cluster(list(map(_fresh, machines)), policy, host_rule=rule)
        for i in range(2):
            cluster._start(Arrival(0, _job("nw", 100_000), -1 - i), 0, None)
        cluster.machines[1].free_cores = 4  # machine 0 is least allocated
        cluster.step(1.0)  # measures machine 0's load: 2 heavy jobs of 4 GPUs
        assert cluster.machines[0].host_busy  # measured under every policy, obeyed by one
        assert cluster.place(Arrival(1, job, 1))
        assert {r.host for r in cluster.running if r.arrival.index == 1} == hosts


def _fresh(m: Machine) -> Machine:
    return Machine(m.cores, m.gpus, m.link_gbps, m.knee)


def test_pod_side_takes_0_or_1_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        drmaestro.main(["--pod-side", "yes"])
    assert "0 or 1" in capsys.readouterr().err


# ---- lending-qos: the per-claim selector over what the devices published


def test_the_published_host_slowdown_is_the_slowdown_the_sim_applies() -> None:
    """The host profile (``colo`` x GPUs) turns the measured host load into ``hostSlowdown``;
    a job placed there must run that much longer, and the published value, rounded to the
    safe side, never promises less."""
    cluster = Cluster([Machine(16, 4, 100, knee=4)], Policy.LENDING_QOS, colo=0.05)
    neighbours = (_job("nw", 100_000), _job("srad", 100_000))
    for i, neighbour in enumerate(neighbours):
        cluster._start(Arrival(0, neighbour, -1 - i), 0, None)
    assert cluster.host_profile() == qos.HostProfile(slowdown_at_full=0.05 * 4)
    load = Cluster.host_load(cluster.machines[0], cluster.host_pressure()[0])
    exact = qos.host_slowdown(load, cluster.host_profile())
    (seen,) = cluster.device_loads()
    job = _job("btree")
    slowed = _run_alone(cluster, Arrival(0, job, 1), host=0, donor=None) / job.base_s - 1
    assert slowed == pytest.approx(0.05 * sum(n.pressure for n in neighbours), rel=0.01)
    assert exact == pytest.approx(slowed, rel=0.01)
    assert exact <= seen.local.host_slowdown < exact + qos.STEP / qos.SCALE


@pytest.mark.parametrize("newcomer", [j.name for j in RODINIA])
def test_a_newcomer_within_the_published_headroom_keeps_a_running_job_in_tolerance(
    newcomer: str,
) -> None:
    """``hostHeadroom`` is the host load a running job's tolerance leaves: a claim whose
    profile's ``host_load`` fits in it slows the running job by no more than its
    tolerance, and one that does not fit would break it."""
    cluster = Cluster([Machine(16, 4, 100, knee=4)], Policy.LENDING_QOS, colo=0.08)
    cluster._start(Arrival(0, _job("nw", 500), 1), 0, None)
    (seen,) = cluster.device_loads()
    fits = cluster.profile(_job(newcomer)).host_load <= seen.local.headroom
    cluster._start(Arrival(0, _job(newcomer, 100_000), -1), 0, None)
    for _ in range(1000):
        if not cluster.busy_with_jobs():
            break
        cluster.step(1.0)
    (done,) = [f for f in cluster.finished if f.arrival.index == 1]
    assert done.violated(TOLERANCE) is not fits


def _nw_queue(cluster: Cluster, count: int) -> None:
    cluster.queue += [Arrival(0, _job("nw", 100), i) for i in range(count)]


@pytest.mark.parametrize(("one_open", "violations"), [(True, 0), (False, 4)])
def test_one_open_device_per_machine_keeps_claims_from_sharing_its_headroom(
    one_open: bool, violations: int
) -> None:
    """The scheduler does not see attributes change between pods: when every free GPU
    publishes the machine's headroom, claims placed before the next publication all take
    it and slow each other past their tolerance. With one open device a machine takes one
    such claim per publication, and the next sees its load."""
    cluster = Cluster([Machine(64, 4, 100, knee=4)], Policy.LENDING_QOS, one_open=one_open)
    _nw_queue(cluster, 4)
    cluster.step(1.0)
    assert len(cluster.running) == (1 if one_open else 4)
    for _ in range(1000):
        if not (cluster.queue or cluster.running):
            break
        cluster.step(1.0)
    assert len(cluster.finished) == 4
    assert sum(f.violated(TOLERANCE) for f in cluster.finished) == violations


def test_only_the_open_device_takes_a_loaded_claim_until_the_next_publication() -> None:
    cluster = Cluster([Machine(64, 4, 100, knee=4)], Policy.LENDING_QOS, publish_every=3)
    _nw_queue(cluster, 4)
    placed = []
    for _ in range(4):
        cluster.step(1.0)
        placed.append(len(cluster.running))
    # Publications before steps 1 and 4: one claim each; the third nw would not fit.
    assert placed == [1, 1, 1, 2]


def test_placements_between_publications_read_the_last_one() -> None:
    """With ``publish_every`` the scheduler reads stale values: a claim that the fresh
    load would refuse is placed until the next publication shows the load."""
    cluster = Cluster(
        [Machine(64, 4, 100, knee=4)], Policy.LENDING_QOS, publish_every=5, one_open=False
    )
    cluster.step(1.0)  # the first publication: an idle machine
    idle = cluster.published
    for i in range(2):
        cluster._start(Arrival(0, _job("nw", 100_000), -1 - i), 0, None)
    for _ in range(4):
        cluster.step(1.0)
    assert cluster.published == idle
    assert cluster.place(Arrival(0, _job("nw"), 1))
    cluster.step(1.0)  # the next publication
    assert cluster.published[0].local.host_slowdown > idle[0].local.host_slowdown
    assert not cluster.place(Arrival(0, _job("nw"), 2))


def test_publish_every_must_be_a_step_at_least(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        drmaestro.main(["--publish-every", "0"])
    assert "--publish-every must be at least 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="publish_every"):
        Cluster([Machine(1, 1, 100, knee=1)], Policy.LENDING_QOS, publish_every=0)
