"""The simulated jobs: a Rodinia-like mix, network-heavy background jobs, warm-up load.

The figures are this simulator's assumptions, shaped after DRMaestro's profiles (its
Fig. 3: HotSpot spends 0.2% of its time moving data to a remote GPU, NW 17%; the
others lie between) and documented in docs/lending-policy.md. ``net_frac`` is the share
of a job's isolated time that a remote GPU adds as data transfer on an idle link;
``gbps`` is the traffic the job puts on both links while it runs remotely.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class JobType:
    name: str
    cpus: int
    base_s: float  # isolated run time with a local GPU
    net_frac: float  # data-transfer share added by a remote GPU on an idle link
    gbps: float  # its traffic while it runs on a remote GPU
    gpus: int = 1
    background_gbps: float = 0.0  # a network-heavy CPU-only job's own traffic

    @property
    def network_sensitive(self) -> bool:
        """The job profile's verdict (DRMaestro's offline profiling): does link load matter."""
        return self.gpus > 0 and self.net_frac >= 0.05


RODINIA = (
    JobType("btree", cpus=4, base_s=60, net_frac=0.05, gbps=5),
    JobType("backprop", cpus=4, base_s=240, net_frac=0.10, gbps=8),
    JobType("gaussian", cpus=2, base_s=120, net_frac=0.08, gbps=6),
    JobType("hotspot", cpus=4, base_s=90, net_frac=0.002, gbps=1),
    JobType("lavamd", cpus=4, base_s=180, net_frac=0.01, gbps=2),
    JobType("nw", cpus=2, base_s=150, net_frac=0.17, gbps=12),
    JobType("pathfinder", cpus=2, base_s=60, net_frac=0.12, gbps=10),
    JobType("srad", cpus=4, base_s=200, net_frac=0.06, gbps=6),
)
# Iperf-like: CPU only, loads its machine's link.
BACKGROUND = JobType(
    "iperf", cpus=2, base_s=1200, net_frac=0.0, gbps=0.0, gpus=0, background_gbps=40
)


@dataclass(frozen=True)
class Arrival:
    at: float
    job: JobType
    index: int


def arrivals(
    count: int, rate_per_s: float, background_share: float, rng: random.Random
) -> list[Arrival]:
    """A Poisson process of ``count`` jobs; types uniform over the mix (DRMaestro's
    simulation draws job types uniformly), ``background_share`` of them network-heavy."""
    out = []
    t = 0.0
    for i in range(count):
        t += rng.expovariate(rate_per_s)
        job = BACKGROUND if rng.random() < background_share else rng.choice(RODINIA)
        out.append(Arrival(at=t, job=job, index=i))
    return out


def warmup(machines: int, cores: int, share: float, rng: random.Random) -> list[tuple[int, int]]:
    """CPU-only long-running jobs using ``share`` of the cluster's cores, placed at random
    whole-machine-or-less chunks so some machines fill up and others stay free: the
    fragmentation that strands GPUs behind busy CPUs. Returns (machine, cores) pairs."""
    want = int(machines * cores * share)
    used = [0] * machines
    out: list[tuple[int, int]] = []
    while want > 0:
        m = rng.randrange(machines)
        take = min(want, cores - used[m], rng.choice((cores // 2, cores)))
        if take <= 0:
            continue
        used[m] += take
        want -= take
        out.append((m, take))
    return out
