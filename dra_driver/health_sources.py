"""The seam between the plugin and whatever judges its devices' health.

A health source (NVML on the node, the fabric's Redfish ``Status``, the manual fence)
turns what it sees into :class:`~composable_dra.model.health.HealthReport` objects for
the node's devices, by their slice names. The :class:`HealthBoard` reads every source on
one tick, keeps the worst report per device, applies the recovery hysteresis
(``composable_dra.model.health_rules``) and hands each changed state to its listeners:
the local slice's taints, the kubelet's ``NodeWatchResources`` stream, metrics and Events.
A new source only implements ``reports``; it needs no effect of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from composable_dra.model import health_rules
from composable_dra.model.health import HealthReport
from composable_dra.process import logs

States = Mapping[str, HealthReport]
# A listener gets every device's state and the new states of those that changed.
Listener = Callable[[States, list[HealthReport]], None]


class HealthSource(Protocol):
    """One judge of the node's devices' health."""

    name: str

    def reports(self) -> Iterable[HealthReport]:
        """The health of the devices this source judges, now. A device left out is
        Healthy as far as this source knows. Raises when the source cannot be read: the
        board then keeps this source's last reports (a blip is not a recovery)."""
        ...


class HealthBoard:
    """Reads every source on each ``poll_once`` and publishes the debounced states.

    ``devices`` names the devices on the node now: each is Healthy unless a source says
    otherwise. ``on_change`` gets every device's state whenever one of them changed.
    """

    def __init__(
        self,
        sources: Sequence[HealthSource],
        devices: Callable[[], Iterable[str]],
        recover_after: int = health_rules.RECOVER_AFTER,
    ) -> None:
        self._sources = list(sources)
        self._devices = devices
        self._recover_after = recover_after
        self._lock = threading.Lock()
        self._last: dict[str, list[HealthReport]] = {}
        self._state: dict[str, health_rules.Debounced] = {}
        self._listeners: list[Listener] = []
        self._log = logs.get(__name__)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add_source(self, source: HealthSource) -> None:
        with self._lock:
            self._sources.append(source)

    def on_change(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def states(self) -> dict[str, HealthReport]:
        """Every device's published state now."""
        with self._lock:
            return {name: d.report for name, d in self._state.items()}

    def _read(self, source: HealthSource) -> list[HealthReport]:
        try:
            reports = list(source.reports())
        except Exception as exc:
            self._log.warning("health source failed", source=source.name, error=str(exc))
            return self._last.get(source.name, [])
        self._last[source.name] = reports
        return reports

    def poll_once(self) -> bool:
        """One tick; True when a device's state changed (the listeners were called)."""
        with self._lock:
            observed = [health_rules.healthy(d, "board") for d in self._devices()]
            for source in self._sources:
                observed.extend(self._read(source))
            nxt = health_rules.step_all(
                self._state, health_rules.merge(observed), self._recover_after
            )
            changed = health_rules.transitions(self._state, nxt)
            gone = set(self._state) - set(nxt)
            self._state = nxt
            states = {n: d.report for n, d in nxt.items()}
        if not changed and not gone:
            return False
        for listener in self._listeners:
            listener(states, changed)
        return True

    def start(self, interval: float) -> None:
        """Poll every ``interval`` seconds in a thread of its own."""
        self.poll_once()
        self._thread = threading.Thread(
            target=self._loop, args=(interval,), name="health", daemon=True
        )
        self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.poll_once()
            except Exception as exc:  # a listener's failure must not end the health loop
                self._log.warning("health poll failed", error=str(exc))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
