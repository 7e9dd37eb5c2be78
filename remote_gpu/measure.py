"""What a donor measures for the lending policy: its link's rate over a moving window, and
per-function call latency against the number of concurrent leases (the samples
`slo.fit` fits).

Both keep bounded memory and take the time as an argument, so they are deterministic
to test; the donor feeds them from its workers' reports (``remote_gpu/lending.py``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from remote_gpu import slo

# Samples kept per function: enough for a stable fit, bounded against a chatty lease.
MAX_SAMPLES = 256


class RateWindow:
    """Bytes moved in the last ``window_s`` seconds, as bytes per second."""

    def __init__(self, window_s: float) -> None:
        if not window_s > 0 or not math.isfinite(window_s):
            raise ValueError(f"the window must be a positive number of seconds, not {window_s}")
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, now: float, nbytes: int) -> None:
        if nbytes <= 0:
            return
        self._drop(now)
        self._events.append((now, nbytes))
        self._total += nbytes

    def rate(self, now: float) -> float:
        self._drop(now)
        return self._total / self.window_s

    def _drop(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._total -= self._events.popleft()[1]


class LatencySamples:
    """(concurrent leases, seconds) per function, the newest ``limit`` of each."""

    def __init__(self, limit: int = MAX_SAMPLES) -> None:
        self.limit = limit
        self._by_function: dict[str, deque[tuple[int, float]]] = {}

    def add(self, function: str, leases: int, seconds: float) -> None:
        if leases < 1 or not (seconds > 0 and math.isfinite(seconds)):
            return
        self._by_function.setdefault(function, deque(maxlen=self.limit)).append((leases, seconds))

    def samples(self, function: str) -> list[tuple[int, float]]:
        return list(self._by_function.get(function, ()))

    def counts(self) -> dict[str, int]:
        return {name: len(s) for name, s in self._by_function.items()}

    def models(self, priors: Mapping[str, slo.LatencyModel]) -> dict[str, slo.LatencyModel]:
        """A model per function: fitted from what was measured, else its prior.

        A fit from one concurrency only (growth unknown) never predicts less growth than
        a prior given for it: the prior is the operator's word on contention.
        """
        models = dict(priors)
        for name, samples in self._by_function.items():
            try:
                fitted = slo.fit(samples)
            except slo.ModelError:
                continue
            prior = priors.get(name)
            if prior is not None and len({k for k, _ in samples}) == 1:
                fitted = slo.LatencyModel(
                    max(fitted.service_s, prior.service_s), max(fitted.growth_s, prior.growth_s)
                )
            models[name] = fitted
        return models


def parse_model(text: str) -> tuple[str, slo.LatencyModel]:
    """``NAME=SERVICE_S[:GROWTH_S]`` (a donor's ``--latency-model``); growth defaults to
    the service time (time slicing). ValueError with the reason."""
    name, eq, rest = text.partition("=")
    service, _, growth = rest.partition(":")
    try:
        service_s = float(service)
        growth_s = float(growth) if growth else service_s
    except ValueError:
        raise ValueError(f"--latency-model {text!r}: expected NAME=SECONDS[:GROWTH]") from None
    if not eq or not name or not (0 < service_s < math.inf and 0 <= growth_s < math.inf):
        raise ValueError(
            f"--latency-model {text!r}: a name, a positive service time and a growth >= 0"
        )
    return name, slo.LatencyModel(service_s, growth_s)
