"""Decisions of the ComposableResource controller, as pure functions.

Observed state goes in (the resource, the fabric as just read, the node's view), one
action comes out. The attach daemon (attach_daemon.py) and the detach handler
(handlers.py) carry the action out; actions.py records it.
Because the fabric is re-read before every decision, a retry after a lost response, a
restart or a duplicate event finds the device already attached (or detached) and does
not act twice.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from composable_dra.fabric.backend import Device, Operation
from composable_dra.k8s import retry

# How long an attach request whose answer nobody saw (the operator died while it was in
# flight) may still land: longer than the fabric client's request timeout (15 s).
REQUEST_SETTLE_SECONDS = 20.0


class ActionKind(enum.StrEnum):
    """What the attach daemon does next (a str, so logs and tests read it as text)."""

    ATTACH = "attach"  # call the fabric
    FOLLOW = "follow"  # an attach task recorded earlier (before a restart) is running
    AWAIT_VISIBLE = "await_visible"  # attached; wait for the node's plugin to see the device
    ONLINE = "online"  # attached and visible
    WAIT = "wait"  # nothing to do yet; look again later
    FAIL = "fail"


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str = ""
    message: str = ""
    device_uuid: str | None = None
    host: str | None = None
    delay: float = 0.0


@dataclass(frozen=True)
class AttachObservation:
    phase: str | None
    device: Device | None  # None: the fabric does not know the device
    host: str | None  # the fabric host of the target node; None: node not mapped
    visible: bool  # DeviceVisible=True on the resource
    elapsed: float  # seconds since the attach began
    timeout: float
    # Another ComposableResource for the same device that goes first: one being deleted
    # (its detach may still be under way) or an older live one. None: no other.
    held_by: str | None = None
    # status.pendingAttach names a fabric task of ours that has not been seen to end.
    task_recorded: bool = False


@dataclass(frozen=True)
class DeviceHolder:
    name: str
    deleting: bool
    created: str  # creationTimestamp (RFC 3339 sorts as text)


def first_holder(me: str, my_created: str, holders: list[DeviceHolder]) -> str | None:
    """The other resource for the same device that this one must wait for, if any.

    A resource being deleted goes first: its detach may still be running, and a device it
    still has attached must not be taken for ours. Among live ones the oldest wins (name
    breaks a tie), so two resources for one device never both go Online.
    """
    for h in sorted(holders, key=lambda h: (not h.deleting, h.created, h.name)):
        if h.name == me:
            continue
        if h.deleting or (h.created, h.name) < (my_created, me):
            return h.name
    return None


def decide_attach(o: AttachObservation) -> Action:
    late = o.elapsed > o.timeout
    if o.held_by is not None and o.phase != "Online":
        if late:
            return Action(
                ActionKind.FAIL, "DeviceHeld", f"the device stayed held by resource {o.held_by}"
            )
        return Action(
            ActionKind.WAIT,
            "DeviceHeld",
            f"waiting for resource {o.held_by}, which holds the device",
            delay=1,
        )
    if o.host is None:
        if late:
            return Action(
                ActionKind.FAIL, "NodeNotOnFabric", "the target node matches no fabric host"
            )
        return Action(
            ActionKind.WAIT,
            "NodeNotOnFabric",
            "the target node matches no fabric host yet",
            delay=2,
        )
    if o.device is None:
        return Action(ActionKind.FAIL, "DeviceNotFound", "the fabric does not know this device")
    d = o.device
    if d.state == "attached" and d.host == o.host:
        if o.visible:
            return Action(
                ActionKind.ONLINE,
                "DeviceVisible",
                "attached and visible on the node",
                device_uuid=d.uuid,
                host=o.host,
            )
        if late:
            return Action(
                ActionKind.FAIL,
                "DeviceNotVisible",
                "attached, but the node's plugin did not see the device in time",
                device_uuid=d.uuid,
                host=o.host,
            )
        return Action(
            ActionKind.AWAIT_VISIBLE,
            "AwaitingNode",
            "attached; waiting for the node to see it",
            device_uuid=d.uuid,
            host=o.host,
            delay=0.5,
        )
    if late:
        return Action(ActionKind.FAIL, "AttachTimeout", f"device still {d.state} after the timeout")
    if d.state == "attached":
        return Action(
            ActionKind.WAIT, "DeviceInUse", f"device is attached to host {d.host}", delay=5
        )
    if d.state == "busy":
        if o.task_recorded:
            return Action(ActionKind.FOLLOW, "Attaching", "following the fabric's attach task")
        return Action(ActionKind.WAIT, "FabricBusy", "the fabric is changing this device", delay=1)
    return Action(ActionKind.ATTACH, "Attaching", f"attaching to host {o.host}", host=o.host)


# -- attaches in flight ---------------------------------------------------------------------


@dataclass(frozen=True)
class AttachRecord:
    """status.pendingAttach: an attach request, recorded before it was sent."""

    host: str
    requested_at: float  # epoch seconds
    monitor: str | None = None
    task: str | None = None
    # A fabric that picks the device: the host's devices before the request (picks.py).
    machine_resources: tuple[str, ...] | None = None

    def operation(self) -> Operation | None:
        if not self.monitor and not self.task:
            return None
        return Operation(monitor=self.monitor or str(self.task), task=self.task)

    def to_json(self) -> dict[str, Any]:
        when = datetime.datetime.fromtimestamp(self.requested_at, datetime.UTC)
        out: dict[str, Any] = {
            "host": self.host,
            "requestedAt": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }
        if self.monitor:
            out["taskMonitor"] = self.monitor
        if self.task:
            out["task"] = self.task
        if self.machine_resources is not None:
            out["machineResources"] = list(self.machine_resources)
        return out


def parse_attach_record(status: Mapping[str, Any]) -> AttachRecord | None:
    """The record in a resource's status; None when there is none or it is unreadable
    (the schema keeps it well-formed; an unreadable one cannot be waited for anyway)."""
    raw = status.get("pendingAttach")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("host"), str):
        return None
    try:
        when = datetime.datetime.fromisoformat(str(raw.get("requestedAt")).replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    before = raw.get("machineResources")
    return AttachRecord(
        raw["host"],
        when.timestamp(),
        str(raw["taskMonitor"]) if raw.get("taskMonitor") else None,
        str(raw["task"]) if raw.get("task") else None,
        tuple(str(b) for b in before) if isinstance(before, list) else None,
    )


CallState = Literal["running", "task", "ended"]


@dataclass(frozen=True)
class InFlight:
    """What may still attach the device behind a detach's back."""

    call_running: bool = False  # this process sent an attach request, not yet answered
    task: bool = False  # the fabric accepted an attach as a task not yet seen to end
    unanswered_for: float | None = None  # s since a request whose answer died with its sender


def attach_in_flight(record: AttachRecord | None, call: CallState | None, now: float) -> InFlight:
    """Combine this process's own attach call (None: it made none) with the status record
    (what survives a restart). The call knows more than the record, so it wins."""
    if call == "running":
        return InFlight(call_running=True)
    if call == "task":
        return InFlight(task=True)
    if call == "ended" or record is None:
        return InFlight()
    if record.operation() is not None:
        return InFlight(task=True)
    return InFlight(unanswered_for=max(0.0, now - record.requested_at))


class DetachKind(enum.StrEnum):
    """What the detach does next."""

    DONE = "done"
    TAINT = "taint"
    BLOCKED = "blocked"
    DETACH = "detach"
    WAIT = "wait"
    AWAIT_ATTACH = "await_attach"
    FOLLOW_ATTACH = "follow_attach"
    AWAIT_RELEASE = "await_release"  # the node's host has not let go of the device yet
    AWAIT_UNPUBLISH = "await_unpublish"  # detached, but the node's slice still lists it
    UNTAINT_STALE = "untaint_stale"  # the same, past the bound or with the Node gone


# How long a detached device may stay listed by its node's plugin before the detach stops
# waiting for it: many of the plugin's polls (2 s by default), well short of forever.
UNPUBLISH_LIMIT_SECONDS = 60.0
# How long a detach waits for the node's plugin to release the device on its host before
# it says so (an Event and the ReleaseRequested condition's reason); it keeps waiting on a
# Ready node (forceDetach is the escape), and stops waiting on a NotReady one.
RELEASE_LIMIT_SECONDS = 120.0


@dataclass(frozen=True)
class DetachObservation:
    device: Device | None
    host: str | None  # the target node's fabric host, if known
    tainted: bool
    referencing_claims: tuple[str, ...]  # namespace/name of claims whose allocation uses it
    force: bool
    attach: InFlight = InFlight()
    settle: float = REQUEST_SETTLE_SECONDS
    # A ResourceSlice of our driver for the target node still lists the device's UUID.
    published_locally: bool = False
    node_exists: bool = True
    unpublish_waited: float = 0.0  # s since the device was first seen detached but listed
    unpublish_limit: float = UNPUBLISH_LIMIT_SECONDS
    release: ReleaseObservation | None = None  # None: no host release asked (the default)


@dataclass(frozen=True)
class ReleaseObservation:
    """The host-side release before a detach: the node's plugin's HostReleased condition."""

    released: bool  # HostReleased=True, written by the node's plugin
    node_ready: bool = True
    waited: float = 0.0  # s since the detach first asked for the release
    limit: float = RELEASE_LIMIT_SECONDS
    why: str = ""  # the plugin's HostReleased message, when it says why not yet


@dataclass(frozen=True)
class DetachAction:
    kind: DetachKind
    reason: str = ""
    message: str = ""
    delay: float = 0.0


def decide_detach(o: DetachObservation) -> DetachAction:
    """Never "done" while an attach of ours may still land: a resource deleted mid-attach
    would otherwise leave its device composed to the node with nobody to detach it.

    Nor while the node's plugin still lists the detached device: the resource's end puts
    the block back in the pool, and the stale local device, untainted, could then be
    allocated (a GPU that is gone, or one GPU twice)."""
    d = o.device
    on_node = d is not None and d.state == "attached" and o.host is not None and d.host == o.host
    if not on_node:
        p = o.attach
        if p.call_running:
            return DetachAction(
                DetachKind.AWAIT_ATTACH,
                "AttachInFlight",
                "waiting for the answer to the attach request",
            )
        if p.task:
            return DetachAction(
                DetachKind.FOLLOW_ATTACH,
                "AttachInFlight",
                "waiting for the fabric's attach task to end",
            )
        if d is not None and d.state == "busy":
            return DetachAction(
                DetachKind.WAIT, "FabricBusy", "the fabric is changing this device", delay=1
            )
        if d is not None and p.unanswered_for is not None and p.unanswered_for < o.settle:
            return DetachAction(
                DetachKind.WAIT,
                "AttachUnanswered",
                "an attach request sent before a restart may still land",
                delay=max(0.5, o.settle - p.unanswered_for),
            )
        if o.published_locally:
            return unpublish(o)
        return DetachAction(DetachKind.DONE, "Detached", "the device is not attached to the node")
    # Attached to our node: taint first, then re-check allocations, then call the fabric.
    if not o.tainted:
        return DetachAction(
            DetachKind.TAINT, "Tainting", "tainting the device NoSchedule before detach"
        )
    if o.referencing_claims and not o.force:
        return DetachAction(
            DetachKind.BLOCKED,
            "InUseByClaim",
            f"still allocated to {', '.join(o.referencing_claims)}; detach waits",
            delay=5,
        )
    return release_gate(o)


def release_gate(o: DetachObservation) -> DetachAction:
    """Tainted and free of claims: call the fabric once the node's host let go of the
    device (its plugin's HostReleased), since a surprise removal with the driver bound can
    hang the host. A Node that is gone holds nothing the cluster can reach; a NotReady one
    cannot answer, so it gets the bound and no more. ``forceDetach`` skips every wait,
    and says so (an audit Event)."""
    r = o.release
    pending = r is not None and not r.released
    if o.force and (pending or o.referencing_claims):
        skipped = [*o.referencing_claims, *(["the host release"] if pending else [])]
        return DetachAction(
            DetachKind.DETACH,
            "ForcedDetach",
            f"forceDetach: detaching despite {', '.join(skipped)}",
        )
    if r is None or r.released:
        return DetachAction(DetachKind.DETACH, "Detaching", "detaching from the node's host")
    if not o.node_exists:
        return DetachAction(
            DetachKind.DETACH, "NodeGone", "the node is gone; detaching without a host release"
        )
    overdue = r.waited >= r.limit
    if not r.node_ready:
        if overdue:
            return DetachAction(
                DetachKind.DETACH,
                "NodeNotReady",
                f"the node has been NotReady for the {r.limit:.0f} s release bound;"
                " detaching without a host release",
            )
        return DetachAction(
            DetachKind.AWAIT_RELEASE,
            "NodeNotReady",
            "the node is NotReady; waiting for it to release the device",
            delay=2,
        )
    why = f": {r.why}" if r.why else ""
    if overdue:
        return DetachAction(
            DetachKind.AWAIT_RELEASE,
            "ReleaseOverdue",
            f"the node's host has not released the device after {r.waited:.0f} s{why};"
            " set spec.forceDetach to detach anyway",
            delay=2,
        )
    return DetachAction(
        DetachKind.AWAIT_RELEASE,
        "AwaitingHostRelease",
        f"waiting for the node's host to release the device{why}",
        delay=1,
    )


def unpublish(o: DetachObservation) -> DetachAction:
    """Detached, but the node's slice still lists the device (the plugin has not polled
    since). Wait with the taint in place, within a bound: a plugin that is gone never
    drops it, and a finalizer must not block the resource forever. Untainting then is
    the lesser harm: the block returns to the pool either way, and the stale device
    fails at prepare rather than the resource, its block and every GPU request behind
    them staying stuck. A Node that is gone runs no pods, so its slice allocates nothing.
    """
    if not o.node_exists:
        return DetachAction(
            DetachKind.UNTAINT_STALE,
            "NodeGone",
            "the node is gone; its slice still lists the device",
        )
    if not o.tainted:
        # Detached behind our back (never tainted): taint it while the plugin catches up.
        return DetachAction(
            DetachKind.TAINT, "Tainting", "tainting the detached device until unlisted"
        )
    if o.unpublish_waited >= o.unpublish_limit:
        return DetachAction(
            DetachKind.UNTAINT_STALE,
            "StillListed",
            f"the node's plugin still lists the detached device after"
            f" {o.unpublish_waited:.0f} s; untainting it anyway",
        )
    return DetachAction(
        DetachKind.AWAIT_UNPUBLISH,
        "AwaitingNode",
        "detached; waiting for the node's plugin to drop the device",
        delay=1,
    )


@dataclass(frozen=True)
class ClaimResult:
    """One entry of a claim's status.allocation.devices.results."""

    claim: str  # namespace/name
    driver: str
    pool: str
    device: str


def referencing_claims(
    results: list[ClaimResult], driver: str, device_refs: set[tuple[str, str]]
) -> tuple[str, ...]:
    """Claims whose allocation names one of the (pool, device) pairs of our driver."""
    return tuple(
        sorted(
            {r.claim for r in results if r.driver == driver and (r.pool, r.device) in device_refs}
        )
    )


# -- retries ----------------------------------------------------------------------------------

FIRST_DELAY = 1.0


def next_delay(failures: int, cap: float, retry_after: float | None = None) -> float:
    """How long to wait after the ``failures``-th failure in a row (the attach daemon, the
    detach handler): what the fabric asked for (Retry-After), else the suite's one backoff
    (composable_dra/k8s/retry.py) from FIRST_DELAY up to ``cap``."""
    return retry.delay(failures, cap=cap, first=FIRST_DELAY, retry_after=retry_after)
