"""Where the ComposableResource controller's decisions are recorded: status, Events,
metrics and log lines, for one resource, in one place.

The attach daemon (attach_daemon.py) and the detach handler (handlers.py) decide with
the pure functions of reconcile.py and make the fabric calls; what each decision says
about the resource goes through ``Recorder``. Nothing here imports kopf: Events go to
whatever ``EventSink`` the caller gives (kopf's, or a test's list).
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from api.v1alpha1 import ComposableResourceSpec
from composable_dra.fabric.errors import FabricError
from composable_dra.k8s.conditions import find
from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from composable_operator import metrics
from composable_operator.reconcile import Action, ActionKind, DetachAction, DetachKind


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, ok: bool, reason: str, message: str) -> JSON:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now(),
    }


def _attached_fields(phase: str, action: Action) -> JSON:
    """The status of a resource whose device the fabric has attached (as ``action`` found it)."""
    return {
        "phase": phase,
        "deviceUUID": action.device_uuid,
        "fabricHost": action.host,
        "error": None,
    }


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


EventSink = Callable[[EventType, str, str], None]  # type, reason, message


class StatusWriter(Protocol):
    async def write(
        self, name: str, fields: JSON, conditions: list[JSON] | None = None
    ) -> None: ...

    def owned(self, name: str) -> JSON | None: ...


@dataclass(frozen=True)
class Seen:
    """What the resource showed when the decision was made: writes that would change
    nothing are left out."""

    phase: str | None = None
    device_uuid: str | None = None


@dataclass
class Recorder:
    """Records one resource's decisions (see the module docstring)."""

    writer: StatusWriter
    event: EventSink
    name: str
    spec: ComposableResourceSpec
    log: Any  # a bound structlog logger
    created: str | None = None  # the resource's creationTimestamp

    async def status(self, fields: JSON, conds: Iterable[tuple[str, bool, str, str]] = ()) -> None:
        await self.writer.write(self.name, fields, [condition(*c) for c in conds])

    # -- attach ---------------------------------------------------------------------------

    async def execute(self, action: Action, seen: Seen) -> None:
        """Record an attach decision (after its fabric call, if any, went out)."""
        match action.kind:
            case ActionKind.ATTACH:
                await self._attaching(action, seen)
            case ActionKind.AWAIT_VISIBLE:
                await self._attached(action, seen)
            case ActionKind.ONLINE:
                await self._online(action, seen)
            case ActionKind.FAIL:
                await self.status(
                    {"phase": "Failed", "error": action.message},
                    [(names.READY, False, action.reason, action.message)],
                )
                self.event(EventType.WARNING, action.reason, action.message)
                self.log.warning("failed", reason=action.reason, error=action.message)
            case ActionKind.WAIT:
                await self.status({}, [(names.ATTACHED, False, action.reason, action.message)])
            case ActionKind.FOLLOW:
                pass  # the record of the task is the attach call's (AttachCalls.end)

    def attaching_conditions(self, action: Action) -> list[JSON]:
        """The condition that goes out with the record of the request, in its one write
        (AttachCalls.start)."""
        return [condition(names.ATTACHED, False, "Attaching", action.message)]

    async def _attaching(self, action: Action, seen: Seen) -> None:
        # Nothing to write: the phase, the record of the request and the condition went
        # out with the request (AttachCalls.start).
        if seen.phase != "Attaching":
            self.event(
                EventType.NORMAL,
                "Attaching",
                f"attaching {self.spec.device_id} via host {action.host}",
            )
        metrics.FABRIC_CALLS.labels(self.spec.fabric, "attach").inc()
        self.log.info(
            "attaching", device=self.spec.device_id, node=self.spec.target_node, host=action.host
        )

    async def _attached(self, action: Action, seen: Seen) -> None:
        if seen.device_uuid == action.device_uuid and seen.phase == "Attaching":
            return
        await self.status(
            _attached_fields("Attaching", action),
            [(names.ATTACHED, True, "Attached", action.message)],
        )
        self.event(
            EventType.NORMAL, "Attached", f"attached as {action.device_uuid}; awaiting the node"
        )
        self.log.info("attached; awaiting the node", uuid=action.device_uuid)

    async def _online(self, action: Action, seen: Seen) -> None:
        if seen.phase == "Online":
            return
        await self.status(
            {**_attached_fields("Online", action), "attachedAt": now()},
            [
                (names.ATTACHED, True, "Attached", "attached to the node's host"),
                (names.READY, True, "Online", action.message),
            ],
        )
        spec = self.spec
        self.event(EventType.NORMAL, "Online", f"{spec.device_id} is online on {spec.target_node}")
        if self.created:
            t0 = datetime.datetime.fromisoformat(self.created.replace("Z", "+00:00"))
            metrics.ATTACH_SECONDS.labels(spec.fabric).observe(
                (datetime.datetime.now(datetime.UTC) - t0).total_seconds()
            )
        self.log.info("online", device=spec.device_id, node=spec.target_node)

    async def fabric_error(self, exc: FabricError, retry_in: float) -> None:
        metrics.FABRIC_ERRORS.labels(self.spec.fabric, exc.kind).inc()
        self.log.warning("fabric error", error=str(exc), type=exc.kind, retry_in=retry_in)
        reason = f"Fabric{exc.kind.title().replace('_', '')}"
        await self.status({"error": str(exc)}, [(names.ATTACHED, False, reason, str(exc))])

    async def config_error(self, exc: Exception) -> None:
        await self.status({"error": str(exc)}, [(names.ATTACHED, False, "FabricConfig", str(exc))])

    def unexpected(self) -> None:
        metrics.RECONCILE_ERRORS.labels("composableresource").inc()
        self.log.exception("attach pass failed")

    # -- detach ---------------------------------------------------------------------------

    async def detach_step(
        self, action: DetachAction, first_look: bool = True, host: str | None = None
    ) -> None:
        """Record a detach decision; ``first_look``: the first time this wait was seen
        (a wait for the node's plugin is written once, not at every look)."""
        match action.kind:
            case DetachKind.AWAIT_ATTACH:
                self.log.info("attach request in flight; awaiting its answer")
            case DetachKind.FOLLOW_ATTACH:
                self.log.info("attach task in flight; following it")
            case DetachKind.AWAIT_UNPUBLISH if first_look:
                await self.status(
                    {"phase": "Detaching", "error": None},
                    [(names.READY, False, action.reason, action.message)],
                )
                self.log.info("detached; waiting for the node's plugin to drop the device")
            case DetachKind.TAINT:
                await self.status(
                    {"phase": "Detaching"}, [(names.READY, False, "Detaching", action.message)]
                )
                self.event(EventType.NORMAL, "Detaching", action.message)
            case DetachKind.BLOCKED | DetachKind.WAIT:
                await self.status(
                    {"phase": "Detaching", "error": action.message},
                    [(names.READY, False, action.reason, action.message)],
                )
            case DetachKind.DETACH:
                metrics.FABRIC_CALLS.labels(self.spec.fabric, "detach").inc()
                if action.reason != "Detaching":
                    # Without the host's release (forceDetach, a node gone or NotReady):
                    # the audit trail of a detach the host may not have been ready for.
                    self.event(EventType.WARNING, action.reason, action.message)
                    self.log.warning("detaching without a host release", why=action.reason)
                self.log.info("detaching", host=host)
            case DetachKind.UNTAINT_STALE:
                self.event(EventType.WARNING, action.reason, action.message)
                self.log.warning("untainting a device the node still lists", why=action.reason)

    async def await_release(self, action: DetachAction, device_uuid: str | None) -> None:
        """Ask the node's plugin for the host release (ReleaseRequested=True, with the
        device's UUID, which a resource deleted mid-attach never recorded); an Event when
        the reason for waiting changes (asked, overdue, node NotReady), not at every look."""
        said = (self.writer.owned(self.name) or {}).get("conditions")
        if (find(said, names.RELEASE_REQUESTED) or {}).get("reason") == action.reason:
            return
        fields = {"phase": "Detaching", "error": None}
        if device_uuid:
            fields["deviceUUID"] = device_uuid
        await self.status(
            fields,
            [
                (names.RELEASE_REQUESTED, True, action.reason, action.message),
                (names.READY, False, action.reason, action.message),
            ],
        )
        kind = EventType.NORMAL if action.reason == "AwaitingHostRelease" else EventType.WARNING
        self.event(kind, action.reason, action.message)
        self.log.info("awaiting the host release", why=action.reason)

    def detached(self, seconds: float) -> None:
        metrics.DETACH_SECONDS.labels(self.spec.fabric).observe(seconds)
        self.event(EventType.NORMAL, "Detached", f"{self.spec.device_id} is back in the pool")
        self.log.info("detached")

    def fabric_unreadable(self, exc: FabricError) -> None:
        metrics.FABRIC_ERRORS.labels(self.spec.fabric, exc.kind).inc()

    async def detach_failed(self, exc: FabricError) -> None:
        """The device stays tainted and attached; the next try re-reads the fabric."""
        metrics.FABRIC_ERRORS.labels(self.spec.fabric, exc.kind).inc()
        await self.status(
            {"phase": "Detaching", "error": str(exc)},
            [(names.READY, False, "DetachFailed", str(exc))],
        )
