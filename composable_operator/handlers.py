"""The ComposableResource controller's kopf handlers: an index, a daemon, a deletion handler.

- ``resources_by_device``: every resource under (fabric, device), so a resource knows who
  else holds its device.
- ``attach``: one AttachDaemon (attach_daemon.py) per live resource.
- ``detach`` (behind the finalizer composable.dra.io/detach): taint the device NoSchedule
  with a DeviceTaintRule, re-check claim allocations, then call the fabric; wait for the
  node's plugin to drop the device. Decisions: reconcile.decide_detach; records:
  actions.Recorder.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import kopf

from api.v1alpha1 import GROUP, VERSION, ComposableResourceSpec
from composable_dra.fabric.backend import FabricError, OperationFailedError
from composable_dra.fabric.registry import FabricConfigError, FabricGoneError
from composable_dra.process import logs
from composable_operator.actions import EventSink, EventType, Recorder
from composable_operator.attach_daemon import AttachDaemon
from composable_operator.controller import PLURAL, Controller, follow, pending_task
from composable_operator.reconcile import (
    DetachKind,
    DeviceHolder,
    decide_detach,
    next_delay,
    parse_attach_record,
)

log = logs.get(__name__)

# Decisions that end something (a fabric call, or the resource let go): taken only on a
# consistent read of claims and slices, not on the watch's cache alone.
ENDINGS = (DetachKind.DETACH, DetachKind.DONE, DetachKind.UNTAINT_STALE)
# The longest a detach waits for a slice event before it looks again anyway (a Node
# deleted meanwhile, the unpublish bound).
UNPUBLISH_LOOK_SECONDS = 5.0


def retry_delay(retry: int, exc: FabricError) -> float:
    """The delay of kopf's next try (``retry``: tries so far) after a fabric error."""
    return next_delay(retry + 1, 30, exc.retry_after or None)


def kopf_events(body: kopf.Body) -> EventSink:
    def post(kind: EventType, reason: str, message: str) -> None:
        (kopf.info if kind is EventType.NORMAL else kopf.warn)(body, reason=reason, message=message)

    return post


def register(registry: kopf.OperatorRegistry, ctl: Controller) -> None:
    """Add the ComposableResource handlers to a kopf registry."""

    # Async: kopf calls it on every event of every resource, and a sync handler would go
    # through kopf's thread pool each time.
    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="resources_by_device")
    async def resources_by_device(
        name: str, spec: kopf.Spec, meta: kopf.Meta, uid: str, **_: Any
    ) -> dict[tuple[str, str], DeviceHolder]:
        # kopf indexes each event once it is in the daemon's live body: the one call per
        # event that logs nothing (an on.event handler logs each call), so the wake of the
        # resource's waiting daemon goes here.
        ctl.resource_events.arrived(uid)
        return {
            (str(spec.get("fabric", "")), str(spec.get("deviceID", ""))): DeviceHolder(
                name,
                bool(meta.get("deletionTimestamp")),
                str(meta.get("creationTimestamp") or ""),
            )
        }

    @kopf.daemon(
        GROUP,
        VERSION,
        PLURAL,
        registry=registry,
        cancellation_timeout=10,
        when=lambda meta, **_: not meta.get("deletionTimestamp"),
    )
    async def attach(
        name: str, body: kopf.Body, stopped: kopf.DaemonStopped, **kwargs: Any
    ) -> None:
        # kopf passes each index by its handler's name.
        by_device: kopf.Index[tuple[str, str], DeviceHolder] = kwargs["resources_by_device"]

        def holders(key: tuple[str, str]) -> list[DeviceHolder]:
            return list(by_device.get(key, []))

        await AttachDaemon(ctl, body, stopped, holders, kopf_events(body), name).run()

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    async def detach(name: str, body: kopf.Body, retry: int, **_: Any) -> None:
        await detach_resource(ctl, name, body, retry)


# Long because it is one loop of kopf's detach handler whose branches share the fabric,
# the attach record and the deadline; each decision in it is a pure function of reconcile.py.
async def detach_resource(ctl: Controller, name: str, body: kopf.Body, retry: int) -> None:
    """Detach the resource's device (see the module docstring); raise kopf.TemporaryError
    to be called again later."""
    spec = ComposableResourceSpec.model_validate(dict(body.spec))
    rlog = log.bind(resource=name, device=spec.device_id, node=spec.target_node)
    rec = Recorder(ctl, kopf_events(body), name, spec, rlog)
    t0 = time.monotonic()
    try:
        fabric, backend = await asyncio.to_thread(ctl.fabrics.get, spec.fabric)
    except FabricGoneError as exc:
        # Nothing can reach that fabric any more: deleting the Fabric object took it out
        # of our hands. Let the resource go, loudly, rather than block it forever.
        message = f"{exc}: {spec.device_id} may still be attached to {spec.target_node}"
        rec.event(EventType.WARNING, "FabricGone", message)
        rlog.warning("fabric gone; releasing the resource without a detach")
        ctl.forget_status(name)
        return
    except FabricConfigError as exc:
        raise kopf.TemporaryError(f"cannot detach: {exc}", delay=10) from exc
    uid = str(body.meta.get("uid") or name)
    ctl.known_status(name, body.status)
    record = parse_attach_record(dict(body.status))
    limit = float(fabric.operation_timeout_seconds)
    consistent = False
    while True:
        call = ctl.attaches.get(uid)
        changes = ctl.cache.slice_changes if ctl.cache is not None else None
        seen = changes.version if changes is not None else 0
        try:
            o, host, refs = await ctl.observe_detach(
                backend, fabric, spec, dict(body.status), name, uid, record, consistent
            )
            action = decide_detach(o)
            if action.kind in ENDINGS and not consistent:
                consistent = True  # confirm on the API server's own state first
                continue
            consistent = False
            if action.kind == DetachKind.AWAIT_ATTACH:
                assert call is not None
                await rec.detach_step(action)
                await asyncio.wait([call.request], timeout=limit)
                continue
            if action.kind == DetachKind.FOLLOW_ATTACH:
                await rec.detach_step(action)
                # A failed attach leaves the device free: the re-read shows it.
                with contextlib.suppress(OperationFailedError):
                    await ctl.end_attach(uid, name, backend, pending_task(call, record), limit)
                record = None
                continue
        except FabricError as exc:
            rec.fabric_unreadable(exc)
            raise kopf.TemporaryError(str(exc), delay=retry_delay(retry, exc)) from exc
        if action.kind == DetachKind.AWAIT_UNPUBLISH:
            # Keep the taint: the block is back in the pool once this resource is gone.
            first = uid not in ctl.unpublish_since
            ctl.unpublish_since.setdefault(uid, time.monotonic())
            await rec.detach_step(action, first_look=first)
            if changes is None:
                raise kopf.TemporaryError(action.message, delay=action.delay)
            left = ctl.settings.unpublish_limit - o.unpublish_waited
            await changes.wait(seen, min(max(left, 0.0) + 0.1, UNPUBLISH_LOOK_SECONDS))
            continue
        await rec.detach_step(action, host=host)
        if action.kind in (DetachKind.DONE, DetachKind.UNTAINT_STALE):
            ctl.attaches.pop(uid, None)
            ctl.picks.picked.pop(uid, None)  # its GPU is gone: no longer anyone's pick
            ctl.unpublish_since.pop(uid, None)
            ctl.forget_status(name)
            await asyncio.to_thread(ctl.untaint, name)
            rec.detached(time.monotonic() - t0)
            return
        if action.kind == DetachKind.TAINT:
            await asyncio.to_thread(ctl.taint, name, refs)
            continue  # re-check allocations with the taint in place
        if action.kind in (DetachKind.BLOCKED, DetachKind.WAIT):
            raise kopf.TemporaryError(action.message, delay=action.delay)
        assert host is not None
        try:
            # The device as read: on a fabric that picks, the one it attached (picks.py).
            device_id = o.device.id if o.device is not None else spec.device_id
            op = await asyncio.to_thread(backend.detach, device_id, host)
            await follow(backend, op, limit)
        except FabricError as exc:
            await rec.detach_failed(exc)
            raise kopf.TemporaryError(str(exc), delay=retry_delay(retry, exc)) from exc
