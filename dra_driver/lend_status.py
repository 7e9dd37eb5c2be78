"""The donor's measurements on its remote devices: the link-busy taint and the lease counter.

A lending plugin reads its own donor's status (``GET /v1/leases/status`` of the lease
API on its node, with its token bound to the node) every ``--donor-status-interval``
seconds. It applies the NA rule with hysteresis to the measured link load
(``netaware.link_busy``) and takes the donor's SLO lease capacity; a change republishes
the slices (``SlicePublisher.set_lend_state``). A donor that does not answer changes
nothing: the slices keep the last state.

With a host profile (``--host-slowdown-at-full``, `QosSampling`) the same poll gives the
per-claim QoS attributes (``composable_dra.lending.qos``): the host load is what crosses
this machine's PCIe and memory, the donor's lease traffic (its link bytes, which its
workers move to and from the GPU) plus, with the NVML source, the GPUs' own PCIe traffic,
over ``--host-bandwidth``. The headroom keeps every held device's claim inside its
tolerance: the profiles of the claims prepared here (their ``qos`` config) and of the
donor's leases (the donor reads the same config when it opens one). One GPU no one holds
carries the headroom; the others publish it taken (``qos.closed``). Values are published
in `qos.STEP` steps, so the slices are rewritten only when one moves a step.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from composable_dra.lending import netaware, qos
from composable_dra.lending.remote_leases import LeaseAPIError, LeaseClient, LendingStatus
from composable_dra.process import logs
from dra_driver.slices import Attrs, LendState, QosAttributes

# This node's devices held by a claim, with the profile it declared (None: none).
Held = Sequence[tuple[str, qos.QosProfile | None]]


@dataclass(frozen=True)
class QosSampling:
    """How the plugin turns what it measures into QoS attributes: the node's host profile,
    the bytes/s its host carries, the GPUs' PCIe bytes/s (None: not measurable here) and
    this node's devices held by claims prepared here, with their profiles."""

    host: qos.HostProfile
    host_bandwidth: float
    pcie: Callable[[], float | None] | None = None
    held: Callable[[], Held] | None = None

    def __post_init__(self) -> None:
        if not self.host_bandwidth > 0 or self.host_bandwidth == float("inf"):
            raise qos.ProfileError(
                f"host bandwidth must be a positive number of bytes/s, not {self.host_bandwidth}"
            )


def _attrs(d: qos.DeviceLoad) -> Attrs:
    return tuple(sorted(qos.published(d).items()))


def qos_attributes(
    status: LendingStatus,
    pcie_bytes_per_second: float | None,
    held: Held,
    sampling: QosSampling,
) -> QosAttributes:
    """The attributes of the host's devices: host load is the lease traffic plus the GPUs'
    PCIe traffic over the host's bandwidth; the remote devices add the donor's link load
    (when the donor knows its link); the headroom keeps the profiles of the claims held
    here (``held``) and of the donor's leases."""
    moved = status.link_bytes_per_second + max(0.0, pcie_bytes_per_second or 0.0)
    host_load = min(1.0, moved / sampling.host_bandwidth)
    running = [(p, False) for _, p in held if p is not None] + [
        (x.qos.profile(), True) for x in status.leased if x.qos is not None
    ]
    slowdown = qos.host_slowdown(host_load, sampling.host)
    room = qos.headroom(host_load, running, sampling.host)
    local = qos.DeviceLoad(slowdown, None, room)
    remote = qos.DeviceLoad(slowdown, status.link_load, room)
    return QosAttributes(
        local=_attrs(local),
        remote=_attrs(remote),
        closed_local=_attrs(qos.closed(local, sampling.host)),
        closed_remote=_attrs(qos.closed(remote, sampling.host)),
        held=tuple(sorted({name for name, _ in held} | {x.device for x in status.leased})),
    )


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
        sampling: QosSampling | None = None,
    ) -> None:
        self._client, self._node, self._publish = client, node, publish
        self.rule, self.interval, self.knee = rule, interval, knee
        self.sampling = sampling
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
        if status is not None and self.sampling is not None:
            held = self.sampling.held() if self.sampling.held is not None else ()
            attrs = qos_attributes(status, self._pcie(), held, self.sampling)
            state = dataclasses.replace(state, qos=attrs)
        if state != self.state:
            self._log.info(
                "lending state changed",
                link_busy=state.busy,
                lease_capacity=state.leases,
                link_load=status.link_load if status else None,
                qos=dict(state.qos.remote) or None,
            )
            self.state = state
            self._publish(state)
        return state

    def _pcie(self) -> float | None:
        read = self.sampling.pcie if self.sampling is not None else None
        if read is None:
            return None
        try:
            return read()
        except Exception:  # unmeasurable now: the lease traffic alone, the traceback logged
            self._log.exception("reading the GPUs' PCIe throughput failed")
            return None

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
