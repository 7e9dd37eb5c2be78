"""The detach of one ComposableResource being deleted (kopf's deletion handler, behind the
finalizer composable.dra.io/detach; handlers.py).

Taint the device NoSchedule with a DeviceTaintRule, re-check claim allocations, then
call the fabric; wait for the node's plugin to drop the device. A failed detach leaves
the device tainted and attached. An attach of this process still in flight (or one a
restart finds recorded) is awaited or followed first. Decisions: reconcile.decide_detach;
records: actions.Recorder. Nothing here imports kopf: ``RetryLater`` asks the caller to
call again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api.v1alpha1 import ComposableResourceSpec, FabricSpec
from composable_dra.fabric.backend import FabricBackend
from composable_dra.fabric.errors import FabricError, OperationFailedError
from composable_dra.fabric.registry import FabricConfigError, FabricGoneError, Fabrics
from composable_dra.k8s.conditions import find
from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from composable_dra.process import logs
from composable_operator.actions import EventSink, EventType, Recorder
from composable_operator.attach_calls import AttachCall, AttachCalls, follow, pending_task
from composable_operator.live import LiveResource
from composable_operator.picks import Picks
from composable_operator.reads import ClusterReads
from composable_operator.reconcile import (
    UNPUBLISH_LIMIT_SECONDS,
    AttachRecord,
    DetachAction,
    DetachKind,
    DetachObservation,
    ReleaseObservation,
    attach_in_flight,
    decide_detach,
    next_delay,
    parse_attach_record,
    referencing_claims,
)
from composable_operator.status_writes import StatusWrites
from composable_operator.taints import Taints

log = logs.get(__name__)

# Decisions that end something (a fabric call, or the resource let go): taken only on a
# consistent read of claims and slices, not on the watch's cache alone.
ENDINGS = (DetachKind.DETACH, DetachKind.DONE, DetachKind.UNTAINT_STALE)
# The longest a detach waits for a slice event before it looks again anyway (a Node
# deleted meanwhile, the unpublish bound).
UNPUBLISH_LOOK_SECONDS = 5.0


class RetryLater(Exception):
    """Call the detach again in ``delay`` seconds (kopf.TemporaryError in handlers.py)."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


def retry_delay(retry: int, exc: FabricError) -> float:
    """The delay of kopf's next try (``retry``: tries so far) after a fabric error."""
    return next_delay(retry + 1, 30, exc.retry_after or None)


@dataclass
class UnpublishWaits:
    """When a detach first waited for the node's plugin to drop its device, by resource
    uid (monotonic; a restart starts the wait again, which only waits longer)."""

    _since: dict[str, float] = field(default_factory=dict)

    def start(self, uid: str) -> bool:
        """The wait is on (from now, unless it was already); True: it just began."""
        first = uid not in self._since
        self._since.setdefault(uid, time.monotonic())
        return first

    def waited(self, uid: str) -> float:
        since = self._since.get(uid)
        return 0.0 if since is None else time.monotonic() - since

    def release(self, uid: str) -> None:
        self._since.pop(uid, None)


def node_ready(node: JSON) -> bool:
    """Whether the Node's kubelet reports Ready (a Node with no Ready condition yet is taken
    as ready: nothing says it cannot answer)."""
    ready = find((node.get("status") or {}).get("conditions"), "Ready")
    return ready is None or ready.get("status") == "True"


@dataclass
class Observed:
    """One look for decide_detach: what it needs, the node's host, the device's names."""

    observation: DetachObservation
    host: str | None
    refs: set[tuple[str, str]]


@dataclass
class Detacher:
    """Detaches resources being deleted (see the module docstring); one per operator."""

    fabrics: Fabrics
    statuses: StatusWrites
    attaches: AttachCalls
    picks: Picks
    reads: ClusterReads
    taints: Taints
    unpublish_limit: float = UNPUBLISH_LIMIT_SECONDS
    unpublish: UnpublishWaits = field(default_factory=UnpublishWaits)
    # Seconds a detach waits for the node's host to release the device before it says so;
    # None: no host release is asked for (reconcile.release_gate).
    release_limit: float | None = None
    release_waits: UnpublishWaits = field(default_factory=UnpublishWaits)

    async def observe(
        self,
        backend: FabricBackend,
        fabric: FabricSpec,
        spec: ComposableResourceSpec,
        status: Mapping[str, Any],
        name: str,
        uid: str,
        record: AttachRecord | None,
        consistent: bool,
    ) -> Observed:
        """What decide_detach needs, read now; with the node's host and the device's names."""
        in_flight = attach_in_flight(record, self.attaches.state(uid), time.time())
        device, host, node = await self.reads.fabric(
            fabric, backend, spec, status, uid, name, consistent
        )
        if host is None and device is not None and device.state == "attached":
            host = device.host if status.get("fabricHost") == device.host else None
        refs, local = await asyncio.to_thread(self.reads.device_refs, spec, device, consistent)
        rules = await asyncio.to_thread(self.taints.rules, name)
        results = await asyncio.to_thread(self.reads.claim_results, consistent)
        observation = DetachObservation(
            device=device,
            host=host,
            # No DeviceTaintRules served (v1.35, v1.36): nothing to wait for (taints.py).
            tainted=not self.taints.served
            or len(rules) >= len(refs) > 0
            or (bool(rules) and not refs),
            referencing_claims=referencing_claims(results, self.reads.driver, refs),
            force=spec.force_detach,
            attach=in_flight,
            published_locally=bool(local),
            node_exists=node is not None,
            unpublish_waited=self.unpublish.waited(uid),
            unpublish_limit=self.unpublish_limit,
            release=self.release_of(fabric, status, node, uid),
        )
        return Observed(observation, host, refs)

    def release_of(
        self, fabric: FabricSpec, status: Mapping[str, Any], node: JSON | None, uid: str
    ) -> ReleaseObservation | None:
        """The host release as the node's plugin reports it; None where none is asked for
        (off, or a vendor driver's node, which runs no plugin of ours)."""
        if self.release_limit is None or fabric.vendor_driver is not None:
            return None
        said = find(status.get("conditions"), names.HOST_RELEASED) or {}
        return ReleaseObservation(
            released=said.get("status") == "True",
            node_ready=node is None or node_ready(node),
            waited=self.release_waits.waited(uid),
            limit=self.release_limit,
            why=str(said.get("message") or "") if said.get("status") == "False" else "",
        )

    def release(self, uid: str, name: str) -> None:
        """The resource is let go: forget all this process kept of it."""
        self.attaches.release(uid)
        self.picks.release(uid)  # its GPU is gone: no longer anyone's pick
        self.unpublish.release(uid)
        self.release_waits.release(uid)
        self.statuses.forget(name)

    async def run(self, name: str, body: LiveResource, events: EventSink, retry: int) -> None:
        """Detach the resource's device (see the module docstring); raise RetryLater to be
        called again later (``retry``: tries so far)."""
        spec = ComposableResourceSpec.model_validate(dict(body.spec))
        rlog = log.bind(resource=name, device=spec.device_id, node=spec.target_node)
        rec = Recorder(self.statuses, events, name, spec, rlog)
        t0 = time.monotonic()
        try:
            fabric, backend = await asyncio.to_thread(self.fabrics.get, spec.fabric)
        except FabricGoneError as exc:
            # Nothing can reach that fabric any more: deleting the Fabric object took it out
            # of our hands. Let the resource go, loudly, rather than block it forever.
            message = f"{exc}: {spec.device_id} may still be attached to {spec.target_node}"
            rec.event(EventType.WARNING, "FabricGone", message)
            rlog.warning("fabric gone; releasing the resource without a detach")
            self.statuses.forget(name)
            return
        except FabricConfigError as exc:
            raise RetryLater(f"cannot detach: {exc}", 10) from exc
        uid = str(body.meta.get("uid") or name)
        self.statuses.known(name, body.status)
        one = _Detach(self, body, name, uid, spec, rec, fabric, backend, retry)
        while not await one.step():
            pass
        rec.detached(time.monotonic() - t0)


@dataclass
class _Detach:
    """One call of the detach of one resource: its looks, in order, until it is let go."""

    parts: Detacher
    body: LiveResource
    name: str
    uid: str
    spec: ComposableResourceSpec
    rec: Recorder
    fabric: FabricSpec
    backend: FabricBackend
    retry: int
    consistent: bool = False  # the next look reads the API server itself

    def __post_init__(self) -> None:
        self.record = parse_attach_record(dict(self.body.status))
        self.limit = float(self.fabric.operation_timeout_seconds)

    async def step(self) -> bool:
        """One look and what it decides; True once the resource is let go."""
        parts = self.parts
        call = parts.attaches.get(self.uid)
        changes = parts.reads.cache.slice_changes if parts.reads.cache is not None else None
        seen = changes.version if changes is not None else 0
        try:
            looked = await parts.observe(
                self.backend,
                self.fabric,
                self.spec,
                dict(self.body.status),
                self.name,
                self.uid,
                self.record,
                self.consistent,
            )
            action = decide_detach(looked.observation)
            if action.kind in ENDINGS and not self.consistent:
                self.consistent = True  # confirm on the API server's own state first
                return False
            self.consistent = False
            if action.kind in (DetachKind.AWAIT_ATTACH, DetachKind.FOLLOW_ATTACH):
                await self.settle_attach(action, call)
                return False
        except FabricError as exc:
            self.rec.fabric_unreadable(exc)
            raise RetryLater(str(exc), retry_delay(self.retry, exc)) from exc
        if action.kind == DetachKind.AWAIT_UNPUBLISH:
            # Keep the taint: the block is back in the pool once this resource is gone.
            await self.rec.detach_step(action, first_look=parts.unpublish.start(self.uid))
            if changes is None:
                raise RetryLater(action.message, action.delay)
            left = parts.unpublish_limit - looked.observation.unpublish_waited
            await changes.wait(seen, min(max(left, 0.0) + 0.1, UNPUBLISH_LOOK_SECONDS))
            return False
        if action.kind == DetachKind.AWAIT_RELEASE:
            # ReleaseRequested tells the node's plugin to release the device on its host.
            parts.release_waits.start(self.uid)
            device = looked.observation.device
            await self.rec.await_release(action, device.uuid if device is not None else None)
            raise RetryLater(action.message, action.delay)
        await self.rec.detach_step(action, host=looked.host)
        if action.kind in (DetachKind.DONE, DetachKind.UNTAINT_STALE):
            parts.release(self.uid, self.name)
            await asyncio.to_thread(parts.taints.untaint, self.name)
            return True
        if action.kind == DetachKind.TAINT:
            await asyncio.to_thread(parts.taints.taint, self.name, looked.refs)
            return False  # re-check allocations with the taint in place
        if action.kind in (DetachKind.BLOCKED, DetachKind.WAIT):
            raise RetryLater(action.message, action.delay)
        await self.detach(looked)
        return False

    async def settle_attach(self, action: DetachAction, call: AttachCall | None) -> None:
        """Let an attach in flight land or end before the device is looked at again."""
        await self.rec.detach_step(action)
        if action.kind == DetachKind.AWAIT_ATTACH:
            assert call is not None
            await asyncio.wait([call.request], timeout=self.limit)
            return
        # A failed attach leaves the device free: the re-read shows it.
        task = pending_task(call, self.record)
        with contextlib.suppress(OperationFailedError):
            await self.parts.attaches.end(self.uid, self.name, self.backend, task, self.limit)
        self.record = None

    async def detach(self, looked: Observed) -> None:
        """The fabric call; a failure leaves the device tainted and attached."""
        assert looked.host is not None
        o = looked.observation
        try:
            # The device as read: on a fabric that picks, the one it attached (picks.py).
            device_id = o.device.id if o.device is not None else self.spec.device_id
            op = await asyncio.to_thread(self.backend.detach, device_id, looked.host)
            await follow(self.backend, op, self.limit)
        except FabricError as exc:
            await self.rec.detach_failed(exc)
            raise RetryLater(str(exc), retry_delay(self.retry, exc)) from exc
