"""A time-stepped cluster: machines with cores, GPUs and one link; jobs that slow down.

Each step (1 s, DRMaestro's periodic scheduling event) the scheduler places what it can
from the queue, every running job advances by ``dt`` over its current effective time, and
the links' load is measured. A job's effective time is its isolated time times

- collocation: ``1 + colo x`` the summed pressure (data rate over the mix's mean) of the
  other GPU jobs whose data crosses the machine that holds its GPU, or with ``pod_side``
  the busier of that one and its pod's host (ours: DRMaestro's collocation profiles are
  not published);
- plus, on a remote GPU, its data-transfer share stretched by the load others put on the
  busier of the two links it crosses (an M/M/1-like ``1 / (1 - load)``), with the load
  capped where the stretch reaches what DRMaestro measured beside Iperf
  (`SATURATED_STRETCH`, about 4.9x). A network-heavy job slows only the transfers that
  cross its link: DRMaestro's Fig. 3 puts the whole slowdown in the transfer part.

and is re-evaluated at every step, as DRMaestro's simulator re-evaluates a task's
completion time whenever a task starts or ends. Decisions that the product makes are
made here by the product's own code: the link-busy taint (`composable_dra.lending.netaware`),
the host-busy taint (`hack.sim.hostaware`), the per-claim QoS selector
(`composable_dra.lending.qos`) and the donor's lease counter
(`remote_gpu.slo.lease_capacity`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from composable_dra.lending import netaware, qos
from hack.sim import hostaware
from hack.sim.workload import SATURATED_STRETCH, TOLERANCE, Arrival, JobType
from remote_gpu import slo

COLO = 0.03
# 1 / (1 - LOAD_CAP) == SATURATED_STRETCH: a saturated path stretches a transfer as
# much as DRMaestro measured, no more.
LOAD_CAP = 1 - 1 / SATURATED_STRETCH


class Policy(enum.Enum):
    SERVER_CENTRIC = "server-centric"  # CPU and GPU on one machine (Firmament-like)
    LENDING = "lending"  # a GPU may be lent by another machine
    LENDING_NA = "lending-na"  # ... and network-sensitive jobs avoid busy donors
    # ... and no GPU job takes a free GPU on a crowded machine (the host-busy taint)
    LENDING_NA_HOST = "lending-na-host"
    # A control, not a product: server-centric with the host-busy taint, to tell what
    # the taint gives from what lending gives.
    SERVER_CENTRIC_HOST = "server-centric-host"
    # Lending where each GPU claim carries its QoS profile and its selector admits only the
    # devices whose published load it can bear (`composable_dra.lending.qos`): DRMaestro's
    # per-job NA rule, no taint.
    LENDING_QOS = "lending-qos"

    @property
    def lends(self) -> bool:
        return self not in (Policy.SERVER_CENTRIC, Policy.SERVER_CENTRIC_HOST)

    @property
    def link_taint(self) -> bool:
        return self in (Policy.LENDING_NA, Policy.LENDING_NA_HOST)

    @property
    def host_taint(self) -> bool:
        return self in (Policy.LENDING_NA_HOST, Policy.SERVER_CENTRIC_HOST)

    @property
    def qos_selector(self) -> bool:
        return self is Policy.LENDING_QOS


@dataclass(frozen=True)
class Published:
    """What one machine's devices publish, as the scheduler reads it back
    (`qos.as_published`): its open GPU (the free one that carries its headroom), as a
    local device and as a device it lends, and its other GPUs (`qos.closed`)."""

    local: qos.DeviceLoad
    remote: qos.DeviceLoad
    closed_local: qos.DeviceLoad
    closed_remote: qos.DeviceLoad

    def view(self, remote: bool, open_device: bool) -> qos.DeviceLoad:
        if open_device:
            return self.remote if remote else self.local
        return self.closed_remote if remote else self.closed_local


@dataclass
class Machine:
    cores: int
    gpus: int
    link_gbps: float
    knee: int
    free_cores: int = 0
    free_gpus: int = 0
    leases: int = 0  # remote leases this machine's GPUs serve
    busy: bool = False  # the link-busy taint on its remote devices
    host_busy: bool = False  # the host-busy taint on its free GPUs
    background_jobs: int = 0  # network-heavy jobs running here

    def __post_init__(self) -> None:
        self.free_cores = self.cores
        self.free_gpus = self.gpus


@dataclass
class Running:
    arrival: Arrival
    start: float
    host: int  # where its CPU part runs
    donor: int | None  # the machine lending its GPU, None when local or CPU only
    progress: float = 0.0
    # Seconds of slowdown so far, by where it came from: its GPU's machine, the consumer's
    # link, the donor's link (to say what a violation came from).
    slowed: dict[str, float] = field(
        default_factory=lambda: {"host": 0.0, "consumer-link": 0.0, "donor-link": 0.0}
    )

    @property
    def job(self) -> JobType:
        return self.arrival.job

    def traffic(self) -> float:
        return self.job.background_gbps + (self.job.gbps if self.donor is not None else 0.0)

    def expected_s(self) -> float:
        """The SLO: the placement's expected time, from the job's profile."""
        remote = self.job.net_frac if self.donor is not None else 0.0
        return self.job.base_s * (1 + remote)


@dataclass
class Finished:
    arrival: Arrival
    start: float
    end: float
    remote: bool
    expected_s: float
    cause: str  # what slowed it most: "host", "consumer-link" or "donor-link"

    def violated(self, tolerance: float) -> bool:
        """DRMaestro's QoS violation: the job ran slower than its placement's expected
        time. Its run time only: the paper counts "jobs that suffered slowdown", and its
        prototype, 1.5x faster to finish, had more violations than Firmament, which a
        count that included waiting could not give."""
        return self.end - self.start > self.expected_s * (1 + tolerance)

    def violated_with_wait(self, tolerance: float) -> bool:
        """The same, counting the time it waited in the queue (not the paper's measure)."""
        return self.end - self.arrival.at > self.expected_s * (1 + tolerance)


@dataclass
class Cluster:
    machines: list[Machine]
    policy: Policy
    rule: netaware.LinkBusyRule = field(default_factory=netaware.LinkBusyRule)
    queue: list[Arrival] = field(default_factory=list)
    running: list[Running] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)
    now: float = 0.0
    loads: list[float] = field(default_factory=list)
    colo: float = COLO
    pod_side: bool = False
    host_rule: netaware.LinkBusyRule = field(default_factory=netaware.LinkBusyRule)
    tolerance: float = TOLERANCE  # the QoS tolerance that decides who is network-sensitive
    # lending-qos: the devices republish their load every this many steps; placements in
    # between read the values of the last publication.
    publish_every: int = 1
    # False: every free GPU publishes the machine's headroom (no `qos.closed`), to show
    # what claims placed before the next publication do to each other.
    one_open: bool = True
    published: list[Published] = field(default_factory=list)
    # Per machine: whether its open GPU is still unallocated since the last publication.
    open_left: list[bool] = field(default_factory=list)
    steps: int = 0

    def __post_init__(self) -> None:
        if self.publish_every < 1:
            raise ValueError(f"publish_every must be at least 1 step, not {self.publish_every}")
        self.loads = [0.0] * len(self.machines)
        self._profiles: dict[JobType, qos.QosProfile] = {}

    # ---- scheduling: every policy scores hosts as kube-scheduler does (blind to
    # interference); only lending may take the GPU from another machine, and only the NA
    # policy lets the link-busy taint keep a sensitive job off a busy donor.

    def place(self, arrival: Arrival) -> bool:
        job = arrival.job
        options: list[tuple[float, int, int | None]] = []
        for host, m in enumerate(self.machines):
            if m.free_cores < job.cpus:
                continue
            cost = self.host_cost(host)
            if job.gpus == 0 or (
                m.free_gpus >= 1 and self._gpu_allowed(m) and self._qos_fits(job, host, False)
            ):
                options.append((cost, host, None))
        # A claim that prefers a local GPU and falls back to a lent one (firstAvailable).
        if job.gpus and not options and self.policy.lends:
            donor = self._donor(job)
            if donor is not None:
                hosts = [
                    (self.host_cost(h), h)
                    for h, m in enumerate(self.machines)
                    if h != donor and m.free_cores >= job.cpus
                ]
                options += [(c, h, donor) for c, h in hosts]
        if not options:
            return False
        _, host, donor = min(options, key=lambda o: (o[0], -self.machines[o[1]].free_cores))
        return self._start(arrival, host, donor)

    def free(self) -> tuple[bool, int]:
        """Whether any GPU is free (and not behind the host-busy taint, where the policy
        has it), and the most free cores on one machine."""
        any_gpu = any(m.free_gpus and self._gpu_allowed(m) for m in self.machines)
        return any_gpu, max(m.free_cores for m in self.machines)

    @staticmethod
    def _full(arrival: Arrival, free: tuple[bool, int]) -> bool:
        """Whether it surely cannot be placed now (a cheap test that spares a full scan):
        no machine has the cores, or it needs a GPU and none is free."""
        any_gpu, most_cores = free
        return (arrival.job.gpus > 0 and not any_gpu) or most_cores < arrival.job.cpus

    def _gpu_allowed(self, m: Machine) -> bool:
        """The host-busy taint, where the policy has it; no simulated job tolerates it."""
        return not self.policy.host_taint or hostaware.may_place(False, m.host_busy)

    # ---- lending-qos: the per-claim selector over what the devices published

    @property
    def gpus_per_machine(self) -> int:
        """The GPUs of a machine: the scenario's machines are alike, so a claim's host
        load is one share of any of them (the largest, where a test mixes them)."""
        return max(m.gpus for m in self.machines)

    def host_profile(self) -> qos.HostProfile:
        """The machines' interference profile: beside others' traffic that fills the
        host (every GPU busy with an average job, host load 1) a job runs ``colo x gpus``
        longer, which is the sim's ``colo`` x the others' summed pressure."""
        return qos.HostProfile(slowdown_at_full=self.colo * self.gpus_per_machine)

    def profile(self, job: JobType) -> qos.QosProfile:
        """A GPU job's claim profile: the transfer a remote GPU adds on an idle link, the
        scenario's tolerance, and its pressure as a share of a host (at most all of it)."""
        got = self._profiles.get(job)
        if got is None:
            share = min(1.0, job.pressure / self.gpus_per_machine)
            got = self._profiles[job] = qos.QosProfile(job.net_frac, self.tolerance, share)
        return got

    def device_loads(self) -> list[Published]:
        """What every machine's devices would publish now: the host slowdown its measured
        host load gives, the headroom left before a job running on its GPUs breaks its
        tolerance, and on the devices it lends its link's load. Once per publication,
        not per candidate."""
        host = self.host_profile()
        crowd = self.host_pressure()
        links = self.link_loads()
        on_gpus: list[list[tuple[qos.QosProfile, bool]]] = [[] for _ in self.machines]
        for r in self.running:
            if r.job.gpus:
                gpu_at = r.donor if r.donor is not None else r.host
                on_gpus[gpu_at].append((self.profile(r.job), r.donor is not None))
        out = []
        for m, c, link, running in zip(self.machines, crowd, links, on_gpus, strict=True):
            load = self.host_load(m, c)
            local = qos.DeviceLoad(
                qos.host_slowdown(load, host), None, qos.headroom(load, running, host)
            )
            lent = qos.DeviceLoad(local.host_slowdown, link, local.headroom)
            out.append(
                Published(
                    local=qos.as_published(local),
                    remote=qos.as_published(lent),
                    closed_local=qos.as_published(
                        qos.closed(local, host) if self.one_open else local
                    ),
                    closed_remote=qos.as_published(
                        qos.closed(lent, host) if self.one_open else lent
                    ),
                )
            )
        return out

    def publish(self) -> None:
        """The node plugins measure and republish; the scheduler reads these until the
        next publication. A machine with a free GPU opens one."""
        self.published = self.device_loads()
        self.open_left = [m.free_gpus > 0 for m in self.machines]

    def _qos_device(self, job: JobType, machine: int, remote: bool) -> bool | None:
        """Which of ``machine``'s free GPUs the claim's selector accepts, as a local or a
        lent device: its open one (True), another (False), or none (None). Only what the
        devices publish: the consumer's link is not known before placement."""
        if not self.published:
            self.publish()
        seen = self.published[machine]
        p = self.profile(job)
        left = self.open_left[machine]
        if left and qos.fits(p, seen.view(remote, open_device=True)):
            return True
        closed_free = self.machines[machine].free_gpus - (1 if left else 0)
        if closed_free > 0 and qos.fits(p, seen.view(remote, open_device=False)):
            return False
        return None

    def _qos_fits(self, job: JobType, machine: int, remote: bool) -> bool:
        """The claim's selector, where the policy has it."""
        if not self.policy.qos_selector or not job.gpus:
            return True
        return self._qos_device(job, machine, remote) is not None

    def host_cost(self, host: int) -> float:
        """The scheduler's score: spread by allocated cores, as kube-scheduler's
        LeastAllocated and Firmament's load-spreading cost do; blind to interference."""
        m = self.machines[host]
        return 1 - m.free_cores / m.cores

    def _donor(self, job: JobType) -> int | None:
        best: int | None = None
        for i, m in enumerate(self.machines):
            if m.free_gpus < 1:
                continue
            # The scheduler's counter check: the donor's link.leases counter.
            if m.leases >= slo.lease_capacity([], {}, m.knee):
                continue
            if self.policy.link_taint and not netaware.may_place(
                job.is_sensitive(self.tolerance), m.busy
            ):
                continue
            if not self._gpu_allowed(m) or not self._qos_fits(job, i, True):
                continue
            if best is None or m.free_gpus > self.machines[best].free_gpus:
                best = i
        return best

    def _start(self, arrival: Arrival, host: int, donor: int | None) -> bool:
        job = arrival.job
        self.machines[host].free_cores -= job.cpus
        self.machines[host].background_jobs += 1 if job.background_gbps else 0
        if job.gpus:
            at = donor if donor is not None else host
            if self.policy.qos_selector and self._qos_device(job, at, donor is not None):
                self.open_left[at] = False
            gpu_at = self.machines[at]
            gpu_at.free_gpus -= 1
            if donor is not None:
                gpu_at.leases += 1
        self.running.append(Running(arrival, self.now, host, donor))
        return True

    def start_filler(self, job: JobType, host: int) -> None:
        """A warm-up job pinned to ``host`` (index -1: not counted in the results)."""
        self._start(Arrival(at=self.now, job=job, index=-1), host, None)

    def busy_with_jobs(self) -> bool:
        """Whether any submitted (not warm-up) job is still running."""
        return any(r.arrival.index >= 0 for r in self.running)

    # ---- time

    def step(self, dt: float) -> None:
        if self.policy.qos_selector and self.steps % self.publish_every == 0:
            self.publish()
        self.steps += 1
        waiting = []
        free = self.free()
        # Placing only takes resources within a step, so a job type that found no place
        # finds none later in the same step: skip its next jobs (same result, less work).
        failed: set[JobType] = set()
        for a in self.queue:
            if a.job in failed or self._full(a, free) or not self.place(a):
                failed.add(a.job)
                waiting.append(a)
            else:
                free = self.free()
        self.queue = waiting
        loads = self.loads = self.link_loads()
        for m, load in zip(self.machines, loads, strict=True):
            m.busy = netaware.link_busy(m.busy, load, self.rule)
        crowd = self.host_pressure()
        for m, c in zip(self.machines, crowd, strict=True):
            m.host_busy = netaware.link_busy(m.host_busy, self.host_load(m, c), self.host_rule)
        still = []
        for r in self.running:
            stretch = 1.0
            if r.job.gpus:
                # The others' traffic on the busiest machine its data crosses.
                others = max(crowd[m] for m in self.crossed(r)) - r.job.pressure
                host = self.colo * max(0.0, others)
                stretch += host
                r.slowed["host"] += dt * host
            if r.donor is not None:
                own = r.traffic()
                on_consumer = loads[r.host] - own / self.machines[r.host].link_gbps
                on_donor = loads[r.donor] - own / self.machines[r.donor].link_gbps
                other = min(LOAD_CAP, max(0.0, on_consumer, on_donor))
                net = r.job.net_frac / (1 - other)
                stretch += net
                side = "consumer-link" if on_consumer >= on_donor else "donor-link"
                r.slowed[side] += dt * (net - r.job.net_frac)
            r.progress += dt / (r.job.base_s * stretch)
            if r.progress >= 1.0:
                self._end(r)
            else:
                still.append(r)
        self.running = still
        self.now += dt

    def _end(self, r: Running) -> None:
        job = r.job
        self.machines[r.host].free_cores += job.cpus
        self.machines[r.host].background_jobs -= 1 if job.background_gbps else 0
        if job.gpus:
            gpu_at = self.machines[r.donor if r.donor is not None else r.host]
            gpu_at.free_gpus += 1
            if r.donor is not None:
                gpu_at.leases -= 1
        cause = max(r.slowed, key=lambda k: r.slowed[k])
        self.finished.append(
            Finished(r.arrival, r.start, self.now, r.donor is not None, r.expected_s(), cause)
        )

    def crossed(self, r: Running) -> tuple[int, ...]:
        """The machines whose PCIe and host memory a GPU job's data crosses: its GPU's;
        for a remote job also its pod's host, where the client stages it for the NIC."""
        if r.donor is None:
            return (r.host,)
        return (r.donor, r.host) if self.pod_side else (r.donor,)

    @staticmethod
    def host_load(m: Machine, crowd: float) -> float:
        """A machine's host load, as its node would measure it: its GPU jobs' traffic over
        what its host carries, taken as every GPU busy with an average job."""
        return netaware.link_load([crowd], m.gpus) if m.gpus else 0.0

    def host_pressure(self) -> list[float]:
        """Per machine, the summed pressure of the GPU jobs whose data crosses it."""
        crowd = [0.0] * len(self.machines)
        for r in self.running:
            if r.job.gpus:
                for m in self.crossed(r):
                    crowd[m] += r.job.pressure
        return crowd

    def link_loads(self) -> list[float]:
        flows: list[list[float]] = [[] for _ in self.machines]
        for r in self.running:
            traffic = r.traffic()
            if not traffic:
                continue
            flows[r.host].append(traffic)
            if r.donor is not None:
                flows[r.donor].append(traffic)
        return [
            netaware.link_load(f, m.link_gbps) for f, m in zip(flows, self.machines, strict=True)
        ]
