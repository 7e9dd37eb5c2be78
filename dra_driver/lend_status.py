"""The donor's measurements on its remote devices: the link-busy taint and the lease counter.

A lending plugin reads its own donor's status (``GET /v1/leases/status`` of the lease
API on its node, with its token bound to the node) every ``--donor-status-interval``
seconds. It applies the NA rule with hysteresis to the measured link load
(``netaware.link_busy``) and takes the donor's SLO lease capacity; a change republishes
the slices (``SlicePublisher.set_lend_state``). A donor that does not answer changes
nothing: the slices keep the last state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from composable_dra import logs
from composable_dra.lending import netaware
from composable_dra.remote_leases import LeaseAPIError, LeaseClient, LendingStatus
from dra_driver.slices import LendState


def next_state(
    previous: LendState,
    status: LendingStatus | None,
    rule: netaware.LinkBusyRule,
    knee: int,
) -> LendState:
    """The state to publish after reading ``status`` (None: the donor did not answer);
    the lease capacity above the link's ``knee`` changes nothing, so it reads as None."""
    if status is None:
        return previous
    busy = status.link_load is not None and netaware.link_busy(
        previous.busy, status.link_load, rule
    )
    leases = status.lease_capacity if status.lease_capacity < knee else None
    return LendState(busy=busy, leases=leases)


class DonorStatusPoller:
    def __init__(
        self,
        client: LeaseClient,
        node: str,
        publish: Callable[[LendState], None],
        rule: netaware.LinkBusyRule,
        interval: float,
        knee: int,
    ) -> None:
        self._client, self._node, self._publish = client, node, publish
        self.rule, self.interval, self.knee = rule, interval, knee
        self.state = LendState()
        self._failing = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log = logs.get(__name__, node=node)

    def poll_once(self) -> LendState:
        status: LendingStatus | None = None
        try:
            status = self._client.status(self._node)
            if self._failing:
                self._log.info("donor status readable again")
            self._failing = False
        except LeaseAPIError as exc:
            if not self._failing:  # once per outage, not every interval
                self._log.warning("donor status unreadable; slices keep", error=exc.message)
            self._failing = True
        state = next_state(self.state, status, self.rule, self.knee)
        if state != self.state:
            self._log.info(
                "lending state changed",
                link_busy=state.busy,
                lease_capacity=state.leases,
                link_load=status.link_load if status else None,
            )
            self.state = state
            self._publish(state)
        return state

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="donor-status", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a defect must not end the loop: the traceback is logged
                self._log.exception("reading the donor status failed")
            self._stop.wait(self.interval)
