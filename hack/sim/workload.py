"""The simulated jobs: a Rodinia-like mix, network-heavy background jobs, warm-up load.

The figures are this simulator's assumptions, shaped after DRMaestro's profiles (its
Fig. 3: HotSpot spends 0.2% of its time moving data to a remote GPU, NW 17%; the
others lie between) and documented in docs/lending-policy.md. ``net_frac`` is the data
transfer a remote GPU adds on an idle link, as a fraction of the job's time with a local
GPU (a transfer share s of the remote run is ``s / (1 - s)``); ``gbps`` is the traffic the
job puts on both links while it runs remotely.

The paper's measured facts are kept as its figures and the model derived from them:
beside a network-intensive job (Iperf) the transfer share grew from 0.2% to 1% (HotSpot)
and from 17% to 49% (NW), which is the same stretch of the transfer part, about 4.9x,
for both (`SATURATED_STRETCH`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

# DRMaestro, Experiment 1 (Fig. 3): share of run time spent moving data to the remote GPU,
# solo and beside Iperf.
FIG3_TRANSFER_SHARE = {"hotspot": (0.002, 0.01), "nw": (0.17, 0.49)}
# A job violates its QoS when it runs over 110% of its expected time. DRMaestro counts
# "jobs that suffered slowdown"; some tolerance is needed for a count to mean anything,
# and 10% is ours.
TOLERANCE = 0.10


def transfer_stretch(solo_share: float, loaded_share: float) -> float:
    """How much longer the transfer part took, from its share of run time solo and
    loaded (the rest of the run is unchanged): (l / (1 - l)) / (s / (1 - s))."""
    return (loaded_share / (1 - loaded_share)) / (solo_share / (1 - solo_share))


# The transfer part's stretch on a path that a network-intensive job saturates.
SATURATED_STRETCH = sum(transfer_stretch(*s) for s in FIG3_TRANSFER_SHARE.values()) / len(
    FIG3_TRANSFER_SHARE
)


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
    def pressure(self) -> float:
        """How hard it loads the PCIe and host memory of the machines its data crosses,
        relative to the mix's average GPU job (ours: the same bytes it would send over
        the network, `gbps`, cross PCIe when its GPU is local)."""
        return self.gbps / MEAN_GBPS if self.gpus else 0.0

    @property
    def network_sensitive(self) -> bool:
        """`is_sensitive` at the default tolerance."""
        return self.is_sensitive(TOLERANCE)

    def is_sensitive(self, tolerance: float) -> bool:
        """The job profile's verdict (DRMaestro's offline profiling, solo and with an
        artificial network load): would a saturated path slow its remote run past its
        QoS tolerance."""
        extra = self.net_frac * (SATURATED_STRETCH - 1)
        return self.gpus > 0 and extra > tolerance * (1 + self.net_frac)


def added(share: float) -> float:
    """The transfer time a remote GPU adds, as a fraction of the local run, from the
    transfer's share of the remote run (Fig. 3's measure)."""
    return share / (1 - share)


# Transfer shares: HotSpot's and NW's from Fig. 3, the others ours (between them).
RODINIA = (
    JobType("btree", cpus=4, base_s=60, net_frac=added(0.05), gbps=5),
    JobType("backprop", cpus=4, base_s=240, net_frac=added(0.10), gbps=8),
    JobType("gaussian", cpus=2, base_s=120, net_frac=added(0.08), gbps=6),
    JobType("hotspot", cpus=4, base_s=90, net_frac=added(0.002), gbps=1),
    JobType("lavamd", cpus=4, base_s=180, net_frac=added(0.01), gbps=2),
    JobType("nw", cpus=2, base_s=150, net_frac=added(0.17), gbps=12),
    JobType("pathfinder", cpus=2, base_s=60, net_frac=added(0.12), gbps=10),
    JobType("srad", cpus=4, base_s=200, net_frac=added(0.06), gbps=6),
)
# The mix's average data rate: a GPU job's host `pressure` is its rate over this.
MEAN_GBPS = sum(j.gbps for j in RODINIA) / len(RODINIA)
# Iperf-like: CPU only; Iperf sends as fast as the path allows, so it fills its
# machine's link (100 Gbit/s, the scenario's default).
BACKGROUND = JobType(
    "iperf", cpus=2, base_s=1200, net_frac=0.0, gbps=0.0, gpus=0, background_gbps=100
)


@dataclass(frozen=True)
class Arrival:
    at: float
    job: JobType
    index: int


def arrivals(
    count: int,
    rate_per_s: float,
    background_share: float,
    rng: random.Random,
    mix: Sequence[JobType] = RODINIA,
) -> list[Arrival]:
    """A Poisson process of ``count`` jobs; types uniform over the mix (DRMaestro's
    simulation draws job types uniformly), ``background_share`` of them network-heavy."""
    out = []
    t = 0.0
    for i in range(count):
        t += rng.expovariate(rate_per_s)
        job = BACKGROUND if rng.random() < background_share else rng.choice(mix)
        out.append(Arrival(at=t, job=job, index=i))
    return out


def scaled(mix: Sequence[JobType], factor: float) -> list[JobType]:
    """The mix with every run time times ``factor`` (run times are ours, not the paper's)."""
    return [replace(j, base_s=j.base_s * factor) for j in mix]


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
