"""What the donor measures for the lending policy, and the SLO admission it decides.

The data plane feeds it: every worker report (bytes both ways, each call's function and
seconds) with the number of leases being served at that moment. From it the donor
answers, in its lease API's status (``GET /v1/leases/status``), its link's load over a
moving window and the lease capacity that keeps every admitted SLO
(``remote_gpu.slo``); the lease API asks ``refusal`` before it opens a lease.
Thread-safe: the data plane's loop and the lease API's executor both call it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from composable_dra.lending import netaware
from composable_dra.lending.remote_leases import FunctionModel, LendingStatus
from remote_gpu import slo
from remote_gpu.measure import LatencySamples, RateWindow

# The most leases a donor's SLO capacity counts up to; the plugin caps it with the link's
# knee (--max-leases), which is far below.
MAX_KNEE = 1024
DEFAULT_WINDOW_S = 10.0


class LendingMonitor:
    def __init__(
        self,
        link_bytes_per_second: float | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        priors: Mapping[str, slo.LatencyModel] | None = None,
        functions: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.link = link_bytes_per_second if link_bytes_per_second else None
        self.priors = dict(priors or {})
        self.functions = frozenset(functions)
        self._clock = clock
        self._lock = threading.Lock()
        self._rate = RateWindow(window_s)
        self._samples = LatencySamples()

    def on_report(self, nbytes: int, calls: Sequence[tuple[str, float]], leases: int) -> None:
        """A worker's report: bytes moved, and (function, seconds) per call, while
        ``leases`` leases were being served."""
        with self._lock:
            self._rate.add(self._clock(), nbytes)
            for name, seconds in calls:
                self._samples.add(name, leases, seconds)

    def models(self) -> dict[str, slo.LatencyModel]:
        with self._lock:
            return self._samples.models(self.priors)

    def capacity(self, admitted: Sequence[slo.Lease]) -> int:
        return slo.lease_capacity(admitted, self.models(), MAX_KNEE)

    def refusal(self, admitted: Sequence[slo.Lease], candidate: slo.Lease) -> str | None:
        """Why ``candidate`` may not join the ``admitted`` leases, or None."""
        models = self.models()
        if candidate.slo_s is not None and candidate.function not in models:
            known = "" if candidate.function in self.functions else " (not on the allow-list)"
            return (
                f"no latency model for {candidate.function!r}{known}: it has not been "
                "measured here and has no --latency-model"
            )
        if slo.admit(admitted, candidate, models, MAX_KNEE):
            return None
        total = len(admitted) + 1
        broken = [
            f"{lease.function} {lease.slo_s:g}s"
            for lease in [*admitted, candidate]
            if lease.slo_s is not None and not slo.fits([lease], models, total)
        ]
        return f"{total} leases would break the latency SLO of {', '.join(broken) or 'a lease'}"

    def status(self, instance: str, admitted: Sequence[slo.Lease]) -> LendingStatus:
        now = self._clock()
        with self._lock:
            rate = self._rate.rate(now)
            window = self._rate.window_s
            counts = self._samples.counts()
            models = self._samples.models(self.priors)
        load = None if self.link is None else netaware.link_load([rate], self.link)
        return LendingStatus(
            instance=instance,
            leases=len(admitted),
            window_s=window,
            link_bytes_per_second=rate,
            link_capacity=self.link,
            link_load=load,
            lease_capacity=slo.lease_capacity(admitted, models, MAX_KNEE),
            functions={
                name: FunctionModel(
                    samples=counts.get(name, 0),
                    service_s=m.service_s,
                    growth_s=m.growth_s,
                )
                for name, m in sorted(models.items())[:256]
            },
        )
