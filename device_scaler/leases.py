"""The lease controller: a remote GPU's allocation gets a lease at its donor.

For each allocated ``<gpu>-remote`` device of our driver (the donor is the pool's node,
the consumer the allocation's node), it has the donor open a lease for that claim and
node and sets the device's ``RemoteGPUReady`` condition with ``data`` = {donor, endpoint,
lease}; no credentials (the consumer's plugin collects those at prepare). A donor that is
unreachable or refuses, after a few tries, gets ``RemoteGPUFailed``, and the scheduler
picks again. Leases whose claim was deallocated or deleted are closed, and a ready lease
its donor no longer has (the donor restarted) is marked failed: each donor's list of
leases is read every ``resync`` seconds, so a restart of either side ends with nothing
left open. The decisions are pure functions (``remote_allocations``, ``plan``); the
controller runs under the scaler's leader election.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram

from composable_dra.k8s import retry
from composable_dra.k8s.events import claim_object, event_body
from composable_dra.k8s.informer import Informer, InformerDriven
from composable_dra.k8s.kube import JSON, Kube, KubeError, NotFound, path
from composable_dra.lending.remote_leases import (
    REMOTE_FAILED,
    REMOTE_READY,
    REMOTE_SUFFIX,
    LeaseAPIError,
    LeaseClient,
    LeaseList,
    OpenLease,
    allocation_node,
    is_node_name,
)
from composable_dra.process import logs
from composable_dra.process.component import Controller
from device_scaler.claim_status import apply_devices

RESOURCE_API = "resource.k8s.io/v1"
FIELD_MANAGER = "composable-dra-lease-controller"
COMPONENT = "composable-dra-lease-controller"

LEASE_SETUP = Histogram(
    "composable_dra_lease_setup_seconds",
    "From a remote device's allocation being seen to RemoteGPUReady on it",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)
LEASES_OPEN = Gauge("composable_dra_leases_open", "Leases open at donors, by donor", ["donor"])
LEASE_FAILURES = Counter(
    "composable_dra_lease_failures_total", "RemoteGPUFailed set, by reason", ["reason"]
)
LEASES_REOPENED = Counter(
    "composable_dra_leases_reopened_total",
    "Leases opened again for the same allocation after their donor restarted",
)
LEASES_CLOSED = Counter(
    "composable_dra_leases_closed_total", "Leases the controller closed, by why", ["why"]
)
# Why the controller closes a lease. Each is exported from the start (at 0): a lease a
# consumer's plugin closed first is never closed here, and a dashboard's rate() should
# still find a series.
GONE = "claim gone or deallocated"
ELSEWHERE = "claim allocated elsewhere"
FAILED = "allocation failed"
SUPERSEDED = "superseded"
for _why in (GONE, ELSEWHERE, FAILED, SUPERSEDED):
    LEASES_CLOSED.labels(_why)

log = logs.get(__name__)


# -- decisions -------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteAlloc:
    """One allocated remote device of one claim, and what its status says so far."""

    uid: str
    namespace: str
    name: str
    donor: str  # the pool: the donor's node
    device: str
    node: str  # the consumer
    state: str  # "" (no condition yet), "ready" or "failed"
    lease: int | None = None  # from a ready device's data
    instance: str | None = None  # the donor process that opened it, from the data
    reserved: bool = True  # a pod holds the claim (``status.reservedFor``)


def _device_state(
    claim: JSON, driver: str, pool: str, device: str
) -> tuple[str, int | None, str | None]:
    for st in (claim.get("status") or {}).get("devices") or []:
        if (st.get("driver"), st.get("pool"), st.get("device")) != (driver, pool, device):
            continue
        conds = {c.get("type"): c.get("status") for c in st.get("conditions") or []}
        if conds.get(REMOTE_FAILED) == "True":
            return "failed", None, None
        if conds.get(REMOTE_READY) == "True":
            data = st.get("data") if isinstance(st.get("data"), dict) else {}
            lease, instance = data.get("lease"), data.get("instance")
            return (
                "ready",
                lease if isinstance(lease, int) else None,
                instance if isinstance(instance, str) else None,
            )
    return "", None, None


def remote_allocations(claims: Iterable[JSON], driver: str) -> list[RemoteAlloc]:
    """Every allocated remote device of ``driver`` in ``claims``."""
    out: list[RemoteAlloc] = []
    for claim in claims:
        meta = claim.get("metadata") or {}
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation or meta.get("deletionTimestamp"):
            continue
        node = allocation_node(allocation)
        for r in (allocation.get("devices") or {}).get("results") or []:
            pool, device = str(r.get("pool", "")), str(r.get("device", ""))
            if r.get("driver") != driver or not device.endswith(REMOTE_SUFFIX):
                continue
            if node is None or not is_node_name(pool):
                continue  # not a lent device: a node pool's remote device has both
            state, lease, instance = _device_state(claim, driver, pool, device)
            reserved = bool((claim.get("status") or {}).get("reservedFor"))
            out.append(
                RemoteAlloc(
                    uid=str(meta.get("uid", "")),
                    namespace=str(meta.get("namespace", "")),
                    name=str(meta.get("name", "")),
                    donor=pool,
                    device=device,
                    node=node,
                    state=state,
                    lease=lease,
                    instance=instance,
                    reserved=reserved,
                )
            )
    return out


def lending_donors(slices: Iterable[JSON], driver: str) -> set[str]:
    """The donor nodes whose pools offer remote devices: whose leases a controller that
    just started must read, though no claim it sees holds one of theirs any more."""
    out: set[str] = set()
    for sl in slices:
        spec = sl.get("spec") or {}
        pool = str((spec.get("pool") or {}).get("name", ""))
        lends = any(
            str(d.get("name", "")).endswith(REMOTE_SUFFIX) for d in spec.get("devices") or []
        )
        if spec.get("driver") == driver and is_node_name(pool) and lends:
            out.add(pool)
    return out


@dataclass(frozen=True)
class Open:
    """Open a lease at the allocation's donor (the donor's lease API) for its claim."""

    alloc: RemoteAlloc
    reopen: bool = False  # the donor restarted and lost the ready lease: open it again


@dataclass(frozen=True)
class Fail:
    """Mark the allocation's device RemoteGPUFailed on its claim, with ``reason``."""

    alloc: RemoteAlloc
    reason: str
    message: str


@dataclass(frozen=True)
class Close:
    """Close ``lease`` at ``donor``, for the reason ``why`` (logged)."""

    donor: str
    lease: int
    why: str


Action = Open | Fail | Close


def plan(allocs: Sequence[RemoteAlloc], listed: Mapping[str, LeaseList]) -> list[Action]:
    """What to do: closes first (a claim's old lease blocks its new one), then opens and
    failures. ``listed`` has the leases of the donors whose list is current (read after
    this controller's last open there); leases of other donors are not judged. A ready
    lease missing from the donor process that opened it was closed by its consumer's
    plugin (the pod ended; the claim, reserved by no pod, is deallocated next) and is
    left alone. Missing from a restarted donor (another instance), it is re-opened for
    the same allocation while a pod holds the claim: the pod's plugin collects the new
    token and its client reconnects."""
    wanted = {(a.donor, a.uid, a.device): a for a in allocs}
    claims = {(a.donor, a.uid) for a in allocs}
    actions: list[Action] = []
    for donor, leases in sorted(listed.items()):
        for info in leases.items:
            a = wanted.get((donor, info.claim_uid, info.device))
            if a is None and (donor, info.claim_uid) not in claims:
                why = GONE
            elif a is None or a.node != info.node:
                why = ELSEWHERE
            elif a.state == "failed":
                why = FAILED
            elif a.state == "ready" and a.lease is not None and a.lease != info.lease:
                why = SUPERSEDED
            else:
                continue
            actions.append(Close(donor, info.lease, why))
    for a in allocs:
        if a.state == "":
            actions.append(Open(a))
        elif a.state == "ready" and a.donor in listed:
            now = listed[a.donor]
            held = {i.lease for i in now.items if (i.claim_uid, i.device) == (a.uid, a.device)}
            if a.lease not in held and a.instance != now.instance and a.reserved:
                actions.append(Open(a, reopen=True))
    return actions


def open_failure(retryable: bool, reopen: bool) -> str:
    """The ``RemoteGPUFailed`` reason of an open that failed: a re-open leaves the running
    pod's lease lost (the health reason its plugin reports, ``DonorWorkerCrashed``); a
    first open, the donor unreachable or refusing (the scheduler picks again)."""
    if reopen:
        return "LeaseLost"
    return "DonorUnreachable" if retryable else "LeaseRefused"


def condition_entry(
    driver: str, a: RemoteAlloc, ready: bool, reason: str, message: str, data: JSON | None
) -> JSON:
    """The claim's device status entry for ``a``: its binding condition, and the lease."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry: JSON = {
        "driver": driver,
        "pool": a.donor,
        "device": a.device,
        "conditions": [
            {
                "type": REMOTE_READY if ready else REMOTE_FAILED,
                "status": "True",
                "reason": reason,
                "message": message[:1000],
                "lastTransitionTime": now,
            }
        ],
    }
    if data is not None:
        entry["data"] = data
    return entry


def merged_status(current: Sequence[JSON], driver: str, entries: Sequence[JSON]) -> list[JSON]:
    """The claim's device status entries this controller applies: ``entries``, and the
    ones of its own already there for the claim's other devices."""
    new = {(e.get("pool"), e.get("device")) for e in entries}
    others = [
        st
        for st in current
        if (st.get("pool"), st.get("device")) not in new
        and st.get("driver") == driver
        and any(c.get("type") in (REMOTE_READY, REMOTE_FAILED) for c in st.get("conditions") or [])
    ]
    return [*others, *entries]


@dataclass(frozen=True)
class Outcome:
    """What an open or a failure writes for one allocation, and how it is reported."""

    alloc: RemoteAlloc
    entry: JSON
    message: str
    fields: Mapping[str, object]
    failure: str = ""  # the failure's reason; "" when the lease is ready
    reopened: bool = False  # a lease its restarted donor lost, open again


_T = TypeVar("_T")
# The longest wait between tries of one open or close: the controller's pass waits on it.
OPEN_RETRY_CAP = 2.0


def with_retries(call: Callable[[], _T], attempts: int, pause: float, stop: threading.Event) -> _T:
    """``call`` until it succeeds or fails for good: retryable errors (the donor not
    reached, or failing inside) are tried ``attempts`` times after the retry policy's
    waits from ``pause`` (composable_dra/k8s/retry.py)."""
    return retry.bounded(
        call, stop, attempts=attempts, retryable=_retryable, cap=OPEN_RETRY_CAP, first=pause
    )


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, LeaseAPIError) and exc.retryable


# -- the adapter -----------------------------------------------------------------------


@dataclass
class LeaseSettings:
    driver: str
    resync: float = 5.0  # seconds between reads of each donor's leases
    attempts: int = 3
    pause: float = 0.2
    debounce: float = 0.02


class LeaseController(InformerDriven):
    thread_name = "lease-controller"

    def __init__(self, kube: Kube, client: LeaseClient, settings: LeaseSettings) -> None:
        super().__init__()
        self.kube, self.client, self.settings = kube, client, settings
        self.claims = Informer(
            kube, path(RESOURCE_API, "resourceclaims"), self._wake.set, name="lease-claims"
        )
        # Which nodes lend (no wake-ups: slices change often, and a donor's leases are
        # read every ``resync`` seconds anyway).
        self.slices = Informer(
            kube,
            path(RESOURCE_API, "resourceslices"),
            name="lease-slices",
            fieldSelector=f"spec.driver={settings.driver}",
        )
        self.informers = [self.claims, self.slices]
        self._listed: dict[str, tuple[float, LeaseList]] = {}
        self._donors: set[str] = set()  # every donor seen, so their leases are judged
        self._first_seen: dict[tuple[str, str], float] = {}
        self._pool = self._executor(8, "lease-open")
        self._events = self._executor(1, "lease-events")

    def _event(self, a: RemoteAlloc, kind: str, reason: str, message: str) -> None:
        """An Event on the claim, posted off the path that opens leases."""
        involved = claim_object(a.name, a.namespace, a.uid)
        body = event_body(involved, a.namespace, kind, reason, message, COMPONENT)

        def post() -> None:
            try:
                self.kube.create(path("v1", "events", namespace=a.namespace), body)
            except KubeError as exc:
                log.debug("event not posted", error=str(exc))

        self._events.submit(post)

    def _loop(self) -> None:
        if not self.wait_synced():
            return
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception:
                log.exception("lease controller pass failed")
            self._wake.wait(min(1.0, self.settings.resync))
            if self._stop.is_set():
                return
            self._stop.wait(self.settings.debounce)
            self._wake.clear()

    def _list(self, donors: Iterable[str]) -> dict[str, LeaseList]:
        """The donors' leases, read again when older than ``resync``; unreachable ones
        are left out (nothing of theirs is judged until they answer)."""
        now = time.monotonic()
        out: dict[str, LeaseList] = {}
        for donor in sorted(donors):
            cached = self._listed.get(donor)
            if cached is None or now - cached[0] >= self.settings.resync:
                try:
                    cached = (now, self.client.list(donor))
                except LeaseAPIError as exc:
                    log.warning("cannot list a donor's leases", donor=donor, error=str(exc))
                    self._listed.pop(donor, None)
                    continue
                self._listed[donor] = cached
                LEASES_OPEN.labels(donor).set(len(cached[1].items))
            out[donor] = cached[1]
        return out

    def reconcile(self) -> int:
        allocs = remote_allocations(self.claims.items(), self.settings.driver)
        now = time.monotonic()
        live = {(a.uid, a.device) for a in allocs}
        for a in allocs:
            self._first_seen.setdefault((a.uid, a.device), now)
        for key in [k for k in self._first_seen if k not in live]:
            del self._first_seen[key]
        self._donors |= {a.donor for a in allocs}
        self._donors |= lending_donors(self.slices.items(), self.settings.driver)
        actions = plan(allocs, self._list(self._donors))
        for action in actions:
            if isinstance(action, Close):
                self._close(action)
        # Claims in parallel, each claim's devices in one task and one status write:
        # concurrent applies of one manager to one claim would each drop the entries the
        # other added.
        by_claim: dict[tuple[str, str], list[Open | Fail]] = {}
        for action in actions:
            if not isinstance(action, Close):
                key = (action.alloc.namespace, action.alloc.name)
                by_claim.setdefault(key, []).append(action)
        list(self._pool.map(self._settle_claim, by_claim.values()))
        return len(actions)

    def _settle_claim(self, actions: Sequence[Open | Fail]) -> None:
        self._settle([self._open(a) if isinstance(a, Open) else self._failed(a) for a in actions])

    def _close(self, action: Close) -> None:
        try:
            with_retries(
                lambda: self.client.close(action.donor, action.lease),
                self.settings.attempts,
                self.settings.pause,
                self._stop,
            )
        except LeaseAPIError as exc:
            log.warning(
                "cannot close a lease", donor=action.donor, lease=action.lease, error=str(exc)
            )
            return
        LEASES_CLOSED.labels(action.why).inc()
        self._listed.pop(action.donor, None)
        log.info("lease closed", donor=action.donor, lease=action.lease, why=action.why)

    def _open(self, action: Open) -> Outcome:
        a = action.alloc
        request = OpenLease(
            claim_uid=a.uid, namespace=a.namespace, name=a.name, device=a.device, node=a.node
        )
        self._listed.pop(a.donor, None)  # a list read before this open is stale
        try:
            info = with_retries(
                lambda: self.client.open(a.donor, request),
                self.settings.attempts,
                self.settings.pause,
                self._stop,
            )
        except LeaseAPIError as exc:
            reason = open_failure(exc.retryable, action.reopen)
            return self._failed(Fail(a, reason, f"donor {a.donor}: {exc.message}"))
        data = {
            "donor": a.donor,
            "endpoint": info.endpoint,
            "lease": info.lease,
            "instance": info.instance,
        }
        message = f"lease {info.lease} at donor {a.donor} ({info.endpoint})"
        reason = "LeaseReopened" if action.reopen else "LeaseOpen"
        entry = condition_entry(self.settings.driver, a, True, reason, message, data)
        fields = {"node": a.node, "lease": info.lease, "reopened": action.reopen}
        return Outcome(a, entry, message, fields, reopened=action.reopen)

    def _failed(self, action: Fail) -> Outcome:
        a = action.alloc
        entry = condition_entry(self.settings.driver, a, False, action.reason, action.message, None)
        fields = {"reason": action.reason, "error": action.message}
        return Outcome(a, entry, f"{action.reason}: {action.message}", fields, action.reason)

    def _settle(self, group: Sequence[Outcome]) -> None:
        """Write one claim's outcomes, then count and report each."""
        if not self._write(group[0].alloc, [o.entry for o in group]):
            return
        for o in group:
            a = o.alloc
            if o.failure:
                LEASE_FAILURES.labels(o.failure).inc()
            elif o.reopened:
                LEASES_REOPENED.inc()
            else:
                seen = self._first_seen.get((a.uid, a.device))
                if seen is not None:
                    LEASE_SETUP.observe(max(0.0, time.monotonic() - seen))
            self._report(a, not o.failure, o.message, **o.fields)

    def _report(self, a: RemoteAlloc, ready: bool, message: str, **fields: object) -> None:
        """The outcome for ``a`` in the log and as an Event on its claim."""
        (log.info if ready else log.warning)(
            "remote GPU ready" if ready else "remote GPU failed",
            claim=f"{a.namespace}/{a.name}",
            donor=a.donor,
            device=a.device,
            **fields,
        )
        kind, reason = ("Normal", REMOTE_READY) if ready else ("Warning", REMOTE_FAILED)
        self._event(a, kind, reason, f"{a.device}: {message}")

    def _write(self, a: RemoteAlloc, entries: Sequence[JSON]) -> bool:
        """Apply ``entries`` to ``a``'s claim and keep this manager's other entries of it
        (apply drops what a manager stops sending)."""
        claim = self.claims.get(f"{a.namespace}/{a.name}") or {}
        current = (claim.get("status") or {}).get("devices") or []
        devices = merged_status(current, self.settings.driver, entries)
        try:
            apply_devices(
                self.kube, devices, FIELD_MANAGER, namespace=a.namespace, name=a.name, uid=a.uid
            )
        except NotFound:
            return False
        except KubeError as exc:
            log.warning(
                "cannot set the claim's lease status",
                claim=f"{a.namespace}/{a.name}",
                error=str(exc),
            )
            self._wake.set()
            return False
        return True


class Together:
    """Controllers started and stopped together (the scaler and this one)."""

    def __init__(self, *parts: Controller) -> None:
        self.parts = parts

    def start(self) -> None:
        for p in self.parts:
            p.start()

    def stop(self) -> None:
        for p in self.parts:
            try:
                p.stop()
            except Exception:
                log.exception("stopping a controller failed")
