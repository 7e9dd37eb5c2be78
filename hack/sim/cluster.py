"""A time-stepped cluster: machines with cores, GPUs and one link; jobs that slow down.

Each step (1 s, DRMaestro's periodic scheduling event) the scheduler places what it can
from the queue, every running job advances by ``dt`` over its current effective time, and
the links' load is measured. A job's effective time is its isolated time times

- host interference: ``1 + colo`` per other busy GPU on the machine that holds its GPU
  (ours: DRMaestro's collocation profiles are not published);
- plus, on a remote GPU, its data-transfer share stretched by the load others put on the
  busier of the two links it crosses (an M/M/1-like ``1 / (1 - load)``), with the load
  capped where the stretch reaches what DRMaestro measured beside Iperf
  (`SATURATED_STRETCH`, about 4.9x). A network-heavy job slows only the transfers that
  cross its link: DRMaestro's Fig. 3 puts the whole slowdown in the transfer part.

and is re-evaluated at every step, as DRMaestro's simulator re-evaluates a task's
completion time whenever a task starts or ends. Decisions that the product makes are
made here by the product's own code: the link-busy taint (`composable_dra.lending.netaware`)
and the donor's lease counter (`composable_dra.lending.slo.lease_capacity`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from composable_dra.lending import netaware, slo
from hack.sim.workload import SATURATED_STRETCH, TOLERANCE, Arrival, JobType

COLO = 0.03
# 1 / (1 - LOAD_CAP) == SATURATED_STRETCH: a saturated path stretches a transfer as
# much as DRMaestro measured, no more.
LOAD_CAP = 1 - 1 / SATURATED_STRETCH


class Policy(enum.Enum):
    SERVER_CENTRIC = "server-centric"  # CPU and GPU on one machine (Firmament-like)
    LENDING = "lending"  # a GPU may be lent by another machine
    LENDING_NA = "lending-na"  # ... and network-sensitive jobs avoid busy donors


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
    tolerance: float = TOLERANCE  # the QoS tolerance that decides who is network-sensitive

    def __post_init__(self) -> None:
        self.loads = [0.0] * len(self.machines)

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
            if job.gpus == 0 or m.free_gpus >= 1:
                options.append((cost, host, None))
        # A claim that prefers a local GPU and falls back to a lent one (firstAvailable).
        if job.gpus and not options and self.policy is not Policy.SERVER_CENTRIC:
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
        """Whether any GPU is free, and the most free cores on one machine."""
        return any(m.free_gpus for m in self.machines), max(m.free_cores for m in self.machines)

    @staticmethod
    def _full(arrival: Arrival, free: tuple[bool, int]) -> bool:
        """Whether it surely cannot be placed now (a cheap test that spares a full scan):
        no machine has the cores, or it needs a GPU and none is free."""
        any_gpu, most_cores = free
        return (arrival.job.gpus > 0 and not any_gpu) or most_cores < arrival.job.cpus

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
            if self.policy is Policy.LENDING_NA and not netaware.may_place(
                job.is_sensitive(self.tolerance), m.busy
            ):
                continue
            if best is None or m.free_gpus > self.machines[best].free_gpus:
                best = i
        return best

    def _start(self, arrival: Arrival, host: int, donor: int | None) -> bool:
        job = arrival.job
        self.machines[host].free_cores -= job.cpus
        self.machines[host].background_jobs += 1 if job.background_gbps else 0
        if job.gpus:
            gpu_at = self.machines[donor if donor is not None else host]
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
        waiting = []
        free = self.free()
        for a in self.queue:
            if self._full(a, free) or not self.place(a):
                waiting.append(a)
            else:
                free = self.free()
        self.queue = waiting
        loads = self.loads = self.link_loads()
        for m, load in zip(self.machines, loads, strict=True):
            m.busy = netaware.link_busy(m.busy, load, self.rule)
        gpus_busy = [m.gpus - m.free_gpus for m in self.machines]
        still = []
        for r in self.running:
            # Contention where the job's GPU sits: its PCIe root and host memory, shared
            # with the machine's other busy GPUs.
            at = r.donor if r.donor is not None else r.host
            stretch = 1.0
            if r.job.gpus:
                host = self.colo * (gpus_busy[at] - 1)
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
