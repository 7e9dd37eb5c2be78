"""SLO-aware sharing: a per-function latency model and the lease capacity it allows.

A donor GPU shared by k leases serves each call more slowly as k grows. For each
allow-listed function the donor fits ``latency(k) = service_s + growth_s * (k - 1)`` to
what it measured (least squares over (k, latency) samples). The capacity a donor
publishes (its remote devices' counters) is then the largest k at which every lease it
holds, each with its own SLO, is predicted to stay within it, capped by the link's knee
(`hack/bench/remote_gpu.py` measures the knee). A new lease that would push an admitted
one past its SLO is therefore never offered.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


class ModelError(ValueError):
    """Too few or unusable samples to fit a model."""


@dataclass(frozen=True)
class LatencyModel:
    service_s: float
    growth_s: float = 0.0

    def latency(self, leases: int) -> float:
        """Predicted seconds per call with ``leases`` concurrent leases on the GPU."""
        return self.service_s + self.growth_s * max(0, leases - 1)


@dataclass(frozen=True)
class Lease:
    """An admitted (or asked-for) lease: which function it calls and its SLO, if any."""

    function: str
    slo_s: float | None = None


def fit(samples: Iterable[tuple[int, float]]) -> LatencyModel:
    """Least-squares fit of latency against the number of concurrent leases, raised by
    the largest residual so that the model bounds every sample it saw (a model that
    under-predicts would admit a lease that breaks an SLO).

    With samples at one concurrency only, the growth is unknown and taken as the
    worst case that keeps the fit conservative: time slicing, ``growth = service``.
    """
    points = [(float(k), float(t)) for k, t in samples if k >= 1 and t > 0 and math.isfinite(t)]
    if not points:
        raise ModelError("no usable (leases, latency) samples")
    n = len(points)
    mean_k = sum(k for k, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    var = sum((k - mean_k) ** 2 for k, _ in points)
    if var == 0:
        # Mean latency at that concurrency, spread over its leases as pure time slicing.
        per_lease = mean_t / mean_k
        return LatencyModel(service_s=per_lease, growth_s=per_lease)
    slope = sum((k - mean_k) * (t - mean_t) for k, t in points) / var
    slope = max(0.0, slope)
    intercept = mean_t - slope * mean_k
    intercept += max(0.0, max(t - (intercept + slope * k) for k, t in points))
    # latency(k) = intercept + slope*k = (intercept + slope) + slope*(k-1)
    return LatencyModel(service_s=max(1e-9, intercept + slope), growth_s=slope)


def fits(leases: Sequence[Lease], models: Mapping[str, LatencyModel], total: int) -> bool:
    """Whether every lease with an SLO keeps it when ``total`` leases share the GPU."""
    for lease in leases:
        if lease.slo_s is None:
            continue
        model = models.get(lease.function)
        if model is None or model.latency(total) > lease.slo_s:
            return False
    return True


def lease_capacity(admitted: Sequence[Lease], models: Mapping[str, LatencyModel], knee: int) -> int:
    """The most leases the GPU may hold: every admitted SLO kept, never past the knee.

    The result is at least ``len(admitted)`` only if the admitted leases fit today;
    otherwise it is ``len(admitted)`` (nothing more is offered; no lease is evicted).
    """
    if knee < 1:
        raise ModelError(f"knee must be at least 1, not {knee}")
    best = len(admitted)
    for total in range(len(admitted) + 1, knee + 1):
        if not fits(admitted, models, total):
            break
        best = total
    return best


def admit(
    admitted: Sequence[Lease], candidate: Lease, models: Mapping[str, LatencyModel], knee: int
) -> bool:
    """Whether a new lease may join: under the capacity, and its own SLO kept too."""
    total = len(admitted) + 1
    return total <= lease_capacity(admitted, models, knee) and fits([candidate], models, total)


def free_leases(admitted: Sequence[Lease], models: Mapping[str, LatencyModel], knee: int) -> int:
    """What the donor publishes as its remote devices' free lease counter."""
    return lease_capacity(admitted, models, knee) - len(admitted)
