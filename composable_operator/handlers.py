"""The ComposableResource controller's kopf handlers: an index, a daemon, a deletion handler.

- ``resources_by_device``: every resource under (fabric, device), so a resource knows who
  else holds its device.
- ``attach``: one AttachDaemon (attach_daemon.py) per live resource.
- ``detach`` (behind the finalizer composable.dra.io/detach): the Detacher (detach.py).

Each talks to one part of the Controller (resource events, the attach daemon, the
Detacher), not to the Controller's state.
"""

from __future__ import annotations

from typing import Any

import kopf

from api.v1alpha1 import GROUP, VERSION
from composable_operator.actions import EventSink, EventType
from composable_operator.attach_daemon import AttachDaemon
from composable_operator.controller import Controller
from composable_operator.detach import RetryLater
from composable_operator.reconcile import DeviceHolder
from composable_operator.status_writes import PLURAL


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
        try:
            await ctl.detacher.run(name, body, kopf_events(body), retry)
        except RetryLater as exc:
            raise kopf.TemporaryError(str(exc), delay=exc.delay) from exc
