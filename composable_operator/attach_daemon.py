"""The attach daemon of one ComposableResource: attach it, then keep it Online.

Each pass re-reads the fabric, asks reconcile.decide_attach what to do, does it (the
fabric call through the Controller's parts) and records it (actions.Recorder). kopf runs one per
resource (handlers.py) and hands it the live object and its stop flag; nothing here
imports kopf, so a test drives it with a fake object, flag and backend.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from api.v1alpha1 import ComposableResourceSpec, FabricSpec
from composable_dra.fabric.backend import Device, FabricBackend, Operation
from composable_dra.fabric.errors import FabricError
from composable_dra.fabric.registry import FabricConfigError, condition_status
from composable_dra.k8s.kube import NotFound
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from composable_dra.process import logs
from composable_operator.actions import EventSink, Recorder, Seen
from composable_operator.controller import Controller
from composable_operator.inventories import online_look
from composable_operator.live import LiveResource, Stopped
from composable_operator.picks import picks_for
from composable_operator.reconcile import (
    Action,
    ActionKind,
    AttachObservation,
    DeviceHolder,
    decide_attach,
    first_holder,
    next_delay,
    parse_attach_record,
)

log = logs.get(__name__)


def visible(status: Mapping[str, Any], uuid: str) -> bool:
    """The node's plugin reports DeviceVisible=True for this UUID."""
    return condition_status(dict(status), names.DEVICE_VISIBLE) == "True" and normalize_uuid(
        status.get("deviceUUID") or ""
    ) == normalize_uuid(uuid)


def finalized(body: LiveResource) -> bool:
    return names.FINALIZER in (body.meta.get("finalizers") or [])


# Seconds an attach step waits for kopf's finalizer before it looks again (a pass).
FINALIZER_WAIT = 1.0


@dataclass(frozen=True)
class Reading:
    """One pass's read of the fabric for this resource."""

    fabric: FabricSpec
    backend: FabricBackend
    host: str | None  # the target node's fabric host
    device: Device | None


@dataclass
class AttachDaemon:
    ctl: Controller
    body: LiveResource
    stopped: Stopped
    holders: Callable[[tuple[str, str]], Iterable[DeviceHolder]]  # others for one device
    event: EventSink
    name: str
    followed: set[str] = field(default_factory=set)  # recorded tasks followed to their end
    started: float = field(default_factory=time.monotonic)
    failures: int = 0  # failures in a row since the last attach
    # The node's host as the last pass found it, when the next pass may keep it: right
    # after our own operation ended. The device itself is read again before a decision,
    # but right after the node's plugin reported it: then ``seen`` is the read that
    # showed it attached, and the plugin has since seen its UUID on the node.
    reuse: Reading | None = None
    seen: Reading | None = None
    # The last read of the fabric, and when the device was last seen in place (a read
    # of ours or a Fabric pass's inventory; monotonic).
    last: Reading | None = None
    confirmed_at: float = float("-inf")

    @property
    def uid(self) -> str:
        return str(self.body.meta.get("uid") or self.name)

    async def run(self) -> None:
        rlog = log.bind(resource=self.name)
        while not self.stopped:
            if self.body.meta.get("deletionTimestamp"):
                return
            spec = ComposableResourceSpec.model_validate(dict(self.body.spec))
            status = dict(self.body.status)
            if status.get("phase") in ("Failed", "Detached", "Detaching"):
                await self.stopped.wait(self.ctl.settings.online_poll)
                continue
            created = self.body.meta.get("creationTimestamp")
            rec = Recorder(self.ctl.statuses, self.event, self.name, spec, rlog, created)
            cap = self.ctl.settings.backoff_max
            try:
                wait = await self.step(spec, status, rec)
            except FabricError as exc:
                wait = self.backoff(cap, exc.retry_after)
                await rec.fabric_error(exc, wait)
            except FabricConfigError as exc:
                await rec.config_error(exc)
                wait = self.backoff(cap)
            except NotFound:
                self.ctl.statuses.forget(self.name)
                return  # the resource is gone
            except Exception:
                rec.unexpected()
                wait = self.backoff(cap)
            if wait is None:
                return
            if wait > 0:
                await self.stopped.wait(wait)

    async def wait_until(self, check: Callable[[LiveResource], bool], limit: float) -> bool:
        """Until ``check`` holds of the live object (True), the time limit or a stop: kopf
        keeps the object current and wakes us on its events (resource_events.py); a look
        is a lookup in memory, no request."""
        events = self.ctl.resource_events
        return await events.wait_until(self.uid, self.body, self.stopped, check, limit)

    def backoff(self, cap: float, retry_after: float | None = None) -> float:
        """One more failure in a row: the wait before the next try."""
        self.failures += 1
        return next_delay(self.failures, cap, retry_after)

    async def read(self, spec: ComposableResourceSpec) -> Reading:
        self.confirmed_at = time.monotonic()
        if self.seen is not None:
            self.last, self.seen = self.seen, None
            return self.last
        if self.reuse is not None:
            kept, self.reuse = self.reuse, None
            status = dict(self.body.status)
            device = await self.ctl.picks.read_device(
                kept.backend, spec, status, self.uid, self.name
            )
            self.last = replace(kept, device=device)
            return self.last
        fabric, backend = await asyncio.to_thread(self.ctl.fabrics.get, spec.fabric)
        device, host, _ = await self.ctl.reads.fabric(
            fabric, backend, spec, dict(self.body.status), self.uid, self.name
        )
        self.last = Reading(fabric, backend, host, device)
        return self.last

    def online_look(self, spec: ComposableResourceSpec, status: dict[str, Any]) -> bool:
        """An Online resource reads nothing of its own while the Fabric daemon's inventory
        passes show its device in place (inventories.online_look): 1,000 Online resources
        cost one inventory read per poll interval. True: nothing to do until the next
        look; False: read the fabric and decide."""
        last = self.last
        if last is None or status.get("phase") != "Online":
            return False
        poll = self.ctl.settings.online_poll
        confirmed = online_look(
            self.ctl.inventories.latest(spec.fabric),
            # A fabric that picks: the device it picked, not the slot (picks.py).
            str(status.get("fabricDeviceID") or spec.device_id),
            status,
            # Vendor-driver mode: no plugin of ours reports (as in step()).
            last.fabric.vendor_driver is not None
            or visible(status, str(status.get("deviceUUID") or "")),
            self.confirmed_at,
            2 * float(last.fabric.poll_interval_seconds) + poll,
            time.monotonic(),
        )
        if confirmed is None:
            return False
        self.confirmed_at = confirmed
        return True

    async def step(
        self, spec: ComposableResourceSpec, status: dict[str, Any], rec: Recorder
    ) -> float | None:
        """One pass: the seconds to wait before the next, or None to stop."""
        self.ctl.statuses.known(self.name, status)
        if self.online_look(spec, status):
            return self.ctl.settings.online_poll
        if not status.get("phase") and not finalized(self.body):
            # A new resource: nothing to read before kopf's finalizer is on.
            await self.wait_until(finalized, FINALIZER_WAIT)
            if not finalized(self.body):
                return 0.0
        r = await self.read(spec)
        open_task = self.ctl.attaches.pending_task(self.uid, parse_attach_record(status))
        if open_task is not None and open_task.monitor in self.followed:
            open_task = None  # followed to its end already; its record is going
        action = decide_attach(
            AttachObservation(
                held_by=first_holder(
                    self.name,
                    str(self.body.meta.get("creationTimestamp") or ""),
                    list(self.holders((spec.fabric, spec.device_id))),
                ),
                phase=status.get("phase"),
                device=r.device,
                host=r.host,
                # Vendor-driver mode: no plugin of ours reports; the scaler waits for
                # the vendor's slice instead (device_scaler/vendor.py).
                visible=r.fabric.vendor_driver is not None
                or (r.device is not None and visible(status, r.device.uuid)),
                elapsed=time.monotonic() - self.started,
                timeout=float(r.fabric.operation_timeout_seconds),
                task_recorded=open_task is not None,
            )
        )
        return await self.act(
            action, r, spec, Seen(status.get("phase"), status.get("deviceUUID")), rec, open_task
        )

    async def act(
        self,
        action: Action,
        r: Reading,
        spec: ComposableResourceSpec,
        seen: Seen,
        rec: Recorder,
        open_task: Operation | None,
    ) -> float | None:
        limit = float(r.fabric.operation_timeout_seconds)
        match action.kind:
            case ActionKind.ATTACH:
                assert action.host is not None
                if self.stopped:
                    return None  # deletion began: from here the detach handler decides
                if not finalized(self.body):
                    # kopf adds its finalizer in the pass that starts this daemon: an attach
                    # sent before the finalizer is on the object could land after a deletion
                    # that no detach handler sees, leaving the device composed. Wait for it.
                    await self.wait_until(finalized, FINALIZER_WAIT)
                    return 0.0
                # No await between the check above and this: a detach finds the call.
                if (p := picks_for(r.backend, spec)) is not None:
                    call = self.ctl.picks.start(self.uid, self.name, p, spec, action.host)
                else:
                    call = self.ctl.attaches.start(
                        self.uid,
                        self.name,
                        r.backend,
                        spec.device_id,
                        action.host,
                        rec.attaching_conditions(action),
                    )
                await rec.execute(action, seen)
                op = await asyncio.shield(call.request)
                await self.ctl.attaches.end(self.uid, self.name, r.backend, op, limit)
                self.failures, self.reuse = 0, r
                return 0.0  # re-read the device: the fabric decides what happened
            case ActionKind.FOLLOW:
                # A task recorded before a restart: follow it rather than wait for the
                # fabric to end it on its own.
                assert open_task is not None
                self.followed.add(open_task.monitor)
                await self.ctl.attaches.end(self.uid, self.name, r.backend, open_task, limit)
                self.reuse = r
                return 0.0
            case ActionKind.AWAIT_VISIBLE:
                await rec.execute(action, seen)
                # The fabric has done its part: wait for the node's plugin to report,
                # watching the live object rather than reading the fabric again.
                uuid = action.device_uuid or ""
                if await self.wait_until(lambda b: visible(b.status, uuid), 5.0):
                    self.seen = r  # the next pass goes Online without reading again
                return 0.0
            case ActionKind.ONLINE:
                await rec.execute(action, seen)
                self.started = time.monotonic()  # a later re-attach gets a fresh timeout
                return self.ctl.settings.online_poll
            case ActionKind.FAIL:
                await rec.execute(action, seen)
                return 0.0
            case ActionKind.WAIT:
                await rec.execute(action, seen)
                return action.delay
