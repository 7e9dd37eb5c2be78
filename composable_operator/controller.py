"""The ComposableResource controller: kopf handlers over the decisions in reconcile.py.

- A daemon per resource attaches it and keeps it Online: each pass re-reads the fabric,
  asks decide_attach what to do, does it, and records it (status, conditions, Events).
- The deletion handler (behind the finalizer composable.dra.io/detach) detaches: taint
  the device NoSchedule with a DeviceTaintRule, re-check claim allocations, then call the
  fabric. A failed detach leaves the device tainted and attached.
- An attach request is recorded in status.pendingAttach before it is sent (and its task
  once the fabric answers), and kept in memory while it runs: a resource deleted
  mid-attach is detached only after that attach landed or ended, in this process or,
  from the record, after a restart.
Blocking calls (the fabric, the API server) run in threads, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from dataclasses import dataclass, field
from typing import Any

import kopf

from api.v1alpha1 import API_VERSION, GROUP, VERSION, ComposableResourceSpec, FabricSpec
from composable_dra import logs, names
from composable_dra.fabric.backend import (
    Device,
    FabricBackend,
    FabricError,
    Host,
    Operation,
    OperationFailedError,
    TransientError,
    normalize_uuid,
)
from composable_dra.fabric.backend import NotFoundError as FabricNotFoundError
from composable_dra.fabric.registry import (
    FabricConfigError,
    FabricGoneError,
    Fabrics,
    condition_status,
    host_for_node,
)
from composable_dra.kube import JSON, Conflict, Kube, NotFound, path
from composable_operator import metrics
from composable_operator.reconcile import (
    UNPUBLISH_LIMIT_SECONDS,
    AttachObservation,
    AttachRecord,
    CallState,
    ClaimResult,
    DetachObservation,
    DeviceHolder,
    attach_in_flight,
    decide_attach,
    decide_detach,
    first_holder,
    parse_attach_record,
    referencing_claims,
)

PLURAL = "composableresources"
MANAGER = "composable-operator"
RESOURCE = "resource.k8s.io/v1"
log = logs.get(__name__)


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


@dataclass
class Settings:
    driver: str = names.DRIVER
    online_poll: float = 10.0
    backoff_max: float = 30.0
    unpublish_limit: float = UNPUBLISH_LIMIT_SECONDS


@dataclass
class AttachCall:
    """One attach request of this process: recorded, sent, answered, followed to its end.

    ``request`` runs apart from the daemon that started it, so that neither the daemon's
    cancellation nor the resource's deletion cuts it off unseen: the detach awaits it.
    """

    request: asyncio.Task[Operation | None]
    ended: bool = False  # the operation it started was followed to its end

    def state(self) -> CallState:
        if not self.request.done():
            return "running"
        if self.ended or self.request.cancelled() or self.request.exception() is not None:
            return "ended"
        return "task" if self.request.result() is not None else "ended"

    def operation(self) -> Operation | None:
        return self.request.result() if self.state() == "task" else None


@dataclass
class Controller:
    kube: Kube
    fabrics: Fabrics
    settings: Settings = field(default_factory=Settings)
    # Attach requests of this process, by resource uid.
    attaches: dict[str, AttachCall] = field(default_factory=dict)
    # The last write of status.pendingAttach under way, by resource uid (kept in order).
    record_writes: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # When a detach first waited for the node's plugin to drop its device, by resource
    # uid (monotonic; a restart starts the wait again, which only waits longer).
    unpublish_since: dict[str, float] = field(default_factory=dict)

    # -- status writes --------------------------------------------------------------

    def set_status(self, name: str, fields: JSON, conditions: list[JSON] | None = None) -> None:
        status_path = path(API_VERSION, PLURAL, name, subresource="status")
        if fields:
            self.kube.merge_patch(status_path, {"status": fields})
        if conditions:
            # Server-side apply, so that the node's plugin keeps its own DeviceVisible.
            self.kube.apply(
                status_path,
                {
                    "apiVersion": API_VERSION,
                    "kind": "ComposableResource",
                    "metadata": {"name": name},
                    "status": {"conditions": conditions},
                },
                MANAGER,
            )

    async def write_status(
        self, name: str, fields: JSON, conditions: list[JSON] | None = None
    ) -> None:
        """set_status, with its two writes (plain fields; our conditions) sent together."""
        writes = []
        if fields:
            writes.append(asyncio.to_thread(self.set_status, name, fields, None))
        if conditions:
            writes.append(asyncio.to_thread(self.set_status, name, {}, conditions))
        await asyncio.gather(*writes)

    # -- attach requests --------------------------------------------------------------

    def _record(
        self, uid: str, name: str, record: AttachRecord | None, extra: JSON
    ) -> asyncio.Task[None]:
        """Write status.pendingAttach after any earlier write of it for this resource, in
        the background: these writes stay off the attach's path (this process knows all
        of it from memory; a restart that misses a task's record only waits longer)."""
        previous = self.record_writes.get(uid)

        async def write() -> None:
            if previous is not None:
                await asyncio.wait([previous])  # in order, whatever became of it
            with contextlib.suppress(NotFound):  # the resource is gone: nothing to record
                await asyncio.to_thread(
                    self.set_status,
                    name,
                    {**extra, "pendingAttach": record.to_json() if record else None},
                )

        task = asyncio.ensure_future(write())
        self.record_writes[uid] = task

        def done(t: asyncio.Task[None]) -> None:
            if self.record_writes.get(uid) is t:
                del self.record_writes[uid]
            if not t.cancelled() and t.exception() is not None:
                log.warning(
                    "status.pendingAttach not written", resource=name, exc_info=t.exception()
                )

        task.add_done_callback(done)
        return task

    async def records_written(self, uid: str) -> None:
        """Until the writes of status.pendingAttach under way for a resource are done."""
        while (task := self.record_writes.get(uid)) is not None:
            await asyncio.wait([task])

    def start_attach(
        self,
        uid: str,
        name: str,
        backend: FabricBackend,
        device_id: str,
        host: str,
    ) -> AttachCall:
        """Record the request in status and send it; record the fabric's task.

        Call with no await between the daemon's check that it is not stopped and this:
        a detach (which starts after the daemon is stopped) then finds the call here.
        """

        async def run() -> Operation | None:
            record = AttachRecord(host, time.time())
            # The record and the request go out together, as the phase did before: an
            # attach waits for no API write. This process knows of the request from
            # memory; the record is for a restart, where it almost always landed first
            # (the one write against the fabric's whole request), and where it did not,
            # the fabric shows the block being composed, or a block composed later is
            # adopted as an orphan and detached when idle.
            self._record(uid, name, record, {"phase": "Attaching", "error": None})
            try:
                op = await asyncio.to_thread(backend.attach, device_id, host)
            except FabricError:
                self._record(uid, name, None, {})  # answered: nothing is in flight
                raise
            if op is not None:  # done at once: end_attach clears the record
                self._record(
                    uid, name, AttachRecord(host, record.requested_at, op.monitor, op.task), {}
                )
            return op

        call = AttachCall(asyncio.ensure_future(run()))
        self.attaches[uid] = call
        return call

    async def end_attach(
        self,
        uid: str,
        name: str,
        backend: FabricBackend,
        op: Operation | None,
        limit: float,
    ) -> None:
        """Follow an attach operation to its end, then forget it (here and in status).

        Raises OperationFailedError when the fabric reports the task failed.
        """
        try:
            if op is not None:
                await follow(backend, op, limit)
        except FabricNotFoundError:
            pass  # monitor and task gone: it ended; the fabric shows how
        except OperationFailedError:
            self._forget(uid, name)
            raise
        self._forget(uid, name)

    def _forget(self, uid: str, name: str) -> None:
        call = self.attaches.get(uid)
        if call is not None:
            call.ended = True
        self._record(uid, name, None, {})

    # -- observations -----------------------------------------------------------------

    def node(self, name: str) -> JSON | None:
        return self.kube.get_or_none(path("v1", "nodes", name))

    def claim_results(self) -> list[ClaimResult]:
        claims = self.kube.get(path(RESOURCE, "resourceclaims"))["items"]
        out = []
        for c in claims:
            key = f"{c['metadata']['namespace']}/{c['metadata']['name']}"
            allocation = c.get("status", {}).get("allocation") or {}
            for r in allocation.get("devices", {}).get("results", []):
                out.append(
                    ClaimResult(key, r.get("driver", ""), r.get("pool", ""), r.get("device", ""))
                )
        return out

    def device_refs(
        self, spec: ComposableResourceSpec, device: Device | None
    ) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        """The (pool, device) names under which the device can be allocated: all of them,
        and those of them in the target node's own slices."""
        refs = set()
        local = set()
        if device is not None:
            refs.add((names.pool_name(spec.fabric, device.zone), spec.device_id))
            slices = self.kube.get(
                path(RESOURCE, "resourceslices"),
                fieldSelector=f"spec.nodeName={spec.target_node},spec.driver={self.settings.driver}",
            )["items"]
            wanted = normalize_uuid(device.uuid)
            for s in slices:
                for d in s["spec"].get("devices", []):
                    uuid = d.get("attributes", {}).get("uuid", {}).get("string", "")
                    if uuid and normalize_uuid(uuid) == wanted:
                        local.add((s["spec"]["pool"]["name"], d["name"]))
        return refs | local, local

    def taint_rule_name(self, name: str) -> str:
        return f"detach-{name}"[:253]

    def taint(self, name: str, refs: set[tuple[str, str]]) -> None:
        for i, (pool, device) in enumerate(sorted(refs)):
            body = {
                "apiVersion": RESOURCE,
                "kind": "DeviceTaintRule",
                "metadata": {
                    "name": f"{self.taint_rule_name(name)}-{i}",
                    "labels": {names.LABEL_FABRIC: "detach", f"{names.PREFIX}/resource": name},
                },
                "spec": {
                    "deviceSelector": {
                        "driver": self.settings.driver,
                        "pool": pool,
                        "device": device,
                    },
                    "taint": {"key": names.TAINT_KEY, "value": name, "effect": "NoSchedule"},
                },
            }
            with contextlib.suppress(Conflict):  # already tainted by an earlier pass
                self.kube.create(path(RESOURCE, "devicetaintrules"), body)

    def taint_rules(self, name: str) -> list[JSON]:
        items: list[JSON] = self.kube.get(
            path(RESOURCE, "devicetaintrules"), labelSelector=f"{names.PREFIX}/resource={name}"
        )["items"]
        return items

    def untaint(self, name: str) -> None:
        for rule in self.taint_rules(name):
            self.kube.delete(path(RESOURCE, "devicetaintrules", rule["metadata"]["name"]))


async def read_fabric(
    ctl: Controller, backend: FabricBackend, spec: ComposableResourceSpec
) -> tuple[Device | None, dict[str, Host], JSON | None]:
    """What a decision about one resource needs, read now and at once: its device (one
    request), the fabric's hosts (a read shared with concurrent callers) and its node."""
    device, hosts, node = await asyncio.gather(
        asyncio.to_thread(backend.device, spec.device_id),
        asyncio.to_thread(backend.hosts),
        asyncio.to_thread(ctl.node, spec.target_node),
    )
    return device, hosts, node


async def follow(backend: FabricBackend, op: Operation | None, limit: float) -> None:
    """Wait for an asynchronous fabric operation; raise FabricError if it failed."""
    if op is None:
        return
    deadline = time.monotonic() + limit
    delay = op.retry_after
    while time.monotonic() < deadline:
        await asyncio.sleep(min(max(delay, 0.05), 5))
        status = await asyncio.to_thread(backend.operation_status, op)
        if status.state == "done":
            return
        if status.state == "failed":
            raise OperationFailedError(status.message or "the fabric reported failure")
        delay = status.retry_after
    raise TransientError("the fabric operation did not finish in time")


def pending_task(call: AttachCall | None, record: AttachRecord | None) -> Operation | None:
    """The attach task to follow: this process's own, else the one recorded in status."""
    if call is not None:
        return call.operation()
    return record.operation() if record is not None else None


async def wait_visible(
    body: kopf.Body, stopped: kopf.DaemonStopped, uuid: str, limit: float
) -> bool:
    """Until the plugin reports DeviceVisible=True for ``uuid`` (kopf keeps ``body`` live).

    True when it did, False at the time limit or when the daemon stops.
    """
    deadline = time.monotonic() + limit
    while not stopped and time.monotonic() < deadline:
        status = dict(body.status)
        if condition_status(status, names.DEVICE_VISIBLE) == "True" and normalize_uuid(
            status.get("deviceUUID") or ""
        ) == normalize_uuid(uuid):
            return True
        await stopped.wait(0.1)
    return False


def register(registry: kopf.OperatorRegistry, ctl: Controller) -> None:
    """Add the ComposableResource handlers to a kopf registry."""

    @kopf.index(GROUP, VERSION, PLURAL, registry=registry, id="resources_by_device")
    def resources_by_device(
        name: str, spec: kopf.Spec, meta: kopf.Meta, **_: Any
    ) -> dict[tuple[str, str], DeviceHolder]:
        """Every resource under (fabric, device): who else holds a device (kept by kopf)."""
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
        rlog = log.bind(resource=name)
        uid = str(body.meta.get("uid") or name)
        followed: set[str] = set()  # recorded tasks this daemon followed to their end
        started = time.monotonic()
        backoff = 1.0
        created = body.meta.get("creationTimestamp")
        # The node's host as the last pass found it, when the next pass may keep it: right
        # after our own operation ended or the node reported the device. The device
        # itself is always read again before a decision.
        reuse: tuple[FabricSpec, FabricBackend, str | None] | None = None
        while not stopped:
            if body.meta.get("deletionTimestamp"):
                return
            spec = ComposableResourceSpec.model_validate(dict(body.spec))
            status = dict(body.status)
            phase = status.get("phase")
            if phase in ("Failed", "Detached", "Detaching"):
                await stopped.wait(ctl.settings.online_poll)
                continue
            try:
                if reuse is not None:
                    fabric, backend, host = reuse
                    reuse = None
                    device = await asyncio.to_thread(backend.device, spec.device_id)
                else:
                    fabric, backend = await asyncio.to_thread(ctl.fabrics.get, spec.fabric)
                    device, hosts, node = await read_fabric(ctl, backend, spec)
                    host = host_for_node(node, fabric.node_mapping, hosts) if node else None
                # Vendor-driver mode: no plugin of ours reports; the scaler waits for
                # the vendor's slice instead (device_scaler/vendor.py).
                visible = fabric.vendor_driver is not None or (
                    condition_status(status, names.DEVICE_VISIBLE) == "True"
                    and device is not None
                    and normalize_uuid(status.get("deviceUUID") or "")
                    == normalize_uuid(device.uuid)
                )
                holders = list(by_device.get((spec.fabric, spec.device_id), []))
                open_task = pending_task(ctl.attaches.get(uid), parse_attach_record(status))
                if open_task is not None and open_task.monitor in followed:
                    open_task = None  # followed to its end already; its record is going
                action = decide_attach(
                    AttachObservation(
                        held_by=first_holder(name, str(created or ""), holders),
                        phase=phase,
                        device=device,
                        host=host,
                        visible=visible,
                        elapsed=time.monotonic() - started,
                        timeout=float(fabric.operation_timeout_seconds),
                        task_recorded=open_task is not None,
                    )
                )
                limit = float(fabric.operation_timeout_seconds)
                if action.kind == "attach":
                    assert action.host is not None
                    if stopped:
                        break  # deletion began: from here the detach handler decides
                    # No await between the check above and this: a detach finds the call.
                    call = ctl.start_attach(uid, name, backend, spec.device_id, action.host)
                    if phase != "Attaching":
                        # The condition goes out with the request; the phase and the
                        # record of the request went first (start_attach).
                        await ctl.write_status(
                            name,
                            {},
                            [condition(names.ATTACHED, False, "Attaching", action.message)],
                        )
                        kopf.info(
                            body,
                            reason="Attaching",
                            message=f"attaching {spec.device_id} via host {action.host}",
                        )
                    metrics.FABRIC_CALLS.labels(spec.fabric, "attach").inc()
                    rlog.info(
                        "attaching", device=spec.device_id, node=spec.target_node, host=action.host
                    )
                    op = await asyncio.shield(call.request)
                    await ctl.end_attach(uid, name, backend, op, limit)
                    backoff = 1.0
                    reuse = (fabric, backend, host)
                    continue  # re-read the device: the fabric decides what happened
                if action.kind == "follow":
                    # A task recorded before a restart: follow it rather than wait for the
                    # fabric to end it on its own.
                    assert open_task is not None
                    followed.add(open_task.monitor)
                    await ctl.end_attach(uid, name, backend, open_task, limit)
                    reuse = (fabric, backend, host)
                    continue
                if action.kind == "await_visible":
                    if status.get("deviceUUID") != action.device_uuid or phase != "Attaching":
                        await ctl.write_status(
                            name,
                            {
                                "phase": "Attaching",
                                "deviceUUID": action.device_uuid,
                                "fabricHost": action.host,
                                "error": None,
                            },
                            [condition(names.ATTACHED, True, "Attached", action.message)],
                        )
                        kopf.info(
                            body,
                            reason="Attached",
                            message=f"attached as {action.device_uuid}; awaiting the node",
                        )
                        rlog.info("attached; awaiting the node", uuid=action.device_uuid)
                    # The fabric has done its part: wait for the node's plugin to report,
                    # watching the live object rather than reading the fabric again.
                    if await wait_visible(body, stopped, action.device_uuid or "", 5.0):
                        reuse = (fabric, backend, host)
                    continue
                elif action.kind == "online":
                    if phase != "Online":
                        await ctl.write_status(
                            name,
                            {
                                "phase": "Online",
                                "deviceUUID": action.device_uuid,
                                "fabricHost": action.host,
                                "error": None,
                                "attachedAt": now(),
                            },
                            [
                                condition(
                                    names.ATTACHED, True, "Attached", "attached to the node's host"
                                ),
                                condition(names.READY, True, "Online", action.message),
                            ],
                        )
                        kopf.info(
                            body,
                            reason="Online",
                            message=f"{spec.device_id} is online on {spec.target_node}",
                        )
                        if created:
                            t0 = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
                            metrics.ATTACH_SECONDS.labels(spec.fabric).observe(
                                (datetime.datetime.now(datetime.UTC) - t0).total_seconds()
                            )
                        rlog.info("online", device=spec.device_id, node=spec.target_node)
                    started = time.monotonic()  # a later re-attach gets a fresh timeout
                    await stopped.wait(ctl.settings.online_poll)
                    continue
                elif action.kind == "fail":
                    await ctl.write_status(
                        name,
                        {"phase": "Failed", "error": action.message},
                        [condition(names.READY, False, action.reason, action.message)],
                    )
                    kopf.warn(body, reason=action.reason, message=action.message)
                    rlog.warning("failed", reason=action.reason, error=action.message)
                    continue
                else:  # wait
                    await ctl.write_status(
                        name,
                        {},
                        [condition(names.ATTACHED, False, action.reason, action.message)],
                    )
                await stopped.wait(action.delay)
            except FabricError as exc:
                metrics.FABRIC_ERRORS.labels(spec.fabric, exc.kind).inc()
                delay = exc.retry_after if exc.retry_after is not None else backoff
                backoff = min(ctl.settings.backoff_max, backoff * 2)
                rlog.warning("fabric error", error=str(exc), type=exc.kind, retry_in=delay)
                await ctl.write_status(
                    name,
                    {"error": str(exc)},
                    [
                        condition(
                            names.ATTACHED,
                            False,
                            f"Fabric{exc.kind.title().replace('_', '')}",
                            str(exc),
                        )
                    ],
                )
                await stopped.wait(delay)
            except FabricConfigError as exc:
                await ctl.write_status(
                    name,
                    {"error": str(exc)},
                    [condition(names.ATTACHED, False, "FabricConfig", str(exc))],
                )
                await stopped.wait(backoff)
                backoff = min(ctl.settings.backoff_max, backoff * 2)
            except NotFound:
                return  # the resource is gone
            except Exception:
                metrics.RECONCILE_ERRORS.labels("composableresource").inc()
                rlog.exception("attach pass failed")
                await stopped.wait(backoff)
                backoff = min(ctl.settings.backoff_max, backoff * 2)

    @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry)
    async def detach(name: str, body: kopf.Body, retry: int, **_: Any) -> None:
        spec = ComposableResourceSpec.model_validate(dict(body.spec))
        rlog = log.bind(resource=name, device=spec.device_id, node=spec.target_node)
        t0 = time.monotonic()
        try:
            fabric, backend = await asyncio.to_thread(ctl.fabrics.get, spec.fabric)
        except FabricGoneError as exc:
            # Nothing can reach that fabric any more: deleting the Fabric object took it out
            # of our hands. Let the resource go, loudly, rather than block it forever.
            kopf.warn(
                body,
                reason="FabricGone",
                message=f"{exc}: {spec.device_id} may still be attached to {spec.target_node}",
            )
            rlog.warning("fabric gone; releasing the resource without a detach")
            return
        except FabricConfigError as exc:
            raise kopf.TemporaryError(f"cannot detach: {exc}", delay=10) from exc
        uid = str(body.meta.get("uid") or name)
        record = parse_attach_record(dict(body.status))
        limit = float(fabric.operation_timeout_seconds)
        while True:
            call = ctl.attaches.get(uid)
            in_flight = attach_in_flight(record, call.state() if call else None, time.time())
            try:
                device, hosts, node = await read_fabric(ctl, backend, spec)
                host = host_for_node(node, fabric.node_mapping, hosts) if node else None
                if host is None and device is not None and device.state == "attached":
                    host = (
                        device.host if dict(body.status).get("fabricHost") == device.host else None
                    )
                refs, local = await asyncio.to_thread(ctl.device_refs, spec, device)
                rules = await asyncio.to_thread(ctl.taint_rules, name)
                claims = referencing_claims(
                    await asyncio.to_thread(ctl.claim_results), ctl.settings.driver, refs
                )
                action = decide_detach(
                    DetachObservation(
                        device=device,
                        host=host,
                        tainted=len(rules) >= len(refs) > 0 or (bool(rules) and not refs),
                        referencing_claims=claims,
                        force=spec.force_detach,
                        attach=in_flight,
                        published_locally=bool(local),
                        node_exists=node is not None,
                        unpublish_waited=time.monotonic()
                        - ctl.unpublish_since.get(uid, time.monotonic()),
                        unpublish_limit=ctl.settings.unpublish_limit,
                    )
                )
                if action.kind == "await_attach":
                    assert call is not None
                    rlog.info("attach request in flight; awaiting its answer")
                    await asyncio.wait([call.request], timeout=limit)
                    continue
                if action.kind == "follow_attach":
                    rlog.info("attach task in flight; following it")
                    # A failed attach leaves the device free: the re-read shows it.
                    with contextlib.suppress(OperationFailedError):
                        await ctl.end_attach(uid, name, backend, pending_task(call, record), limit)
                    record = None
                    continue
            except FabricError as exc:
                metrics.FABRIC_ERRORS.labels(spec.fabric, exc.kind).inc()
                raise kopf.TemporaryError(
                    str(exc), delay=exc.retry_after or min(30, 2**retry)
                ) from exc
            if action.kind == "await_unpublish":
                # Keep the taint: the block is back in the pool once this resource is gone.
                if uid not in ctl.unpublish_since:  # written once, not at every look
                    ctl.unpublish_since[uid] = time.monotonic()
                    await ctl.write_status(
                        name,
                        {"phase": "Detaching", "error": None},
                        [condition(names.READY, False, action.reason, action.message)],
                    )
                    rlog.info("detached; waiting for the node's plugin to drop the device")
                raise kopf.TemporaryError(action.message, delay=action.delay)
            if action.kind in ("done", "untaint_stale"):
                ctl.attaches.pop(uid, None)
                ctl.unpublish_since.pop(uid, None)
                if action.kind == "untaint_stale":
                    kopf.warn(body, reason=action.reason, message=action.message)
                    rlog.warning("untainting a device the node still lists", why=action.reason)
                await asyncio.to_thread(ctl.untaint, name)
                metrics.DETACH_SECONDS.labels(spec.fabric).observe(time.monotonic() - t0)
                kopf.info(body, reason="Detached", message=f"{spec.device_id} is back in the pool")
                rlog.info("detached")
                return
            if action.kind == "taint":
                await ctl.write_status(
                    name,
                    {"phase": "Detaching"},
                    [condition(names.READY, False, "Detaching", action.message)],
                )
                kopf.info(body, reason="Detaching", message=action.message)
                await asyncio.to_thread(ctl.taint, name, refs)
                continue  # re-check allocations with the taint in place
            if action.kind in ("blocked", "wait"):
                await ctl.write_status(
                    name,
                    {"phase": "Detaching", "error": action.message},
                    [condition(names.READY, False, action.reason, action.message)],
                )
                raise kopf.TemporaryError(action.message, delay=action.delay)
            assert host is not None
            metrics.FABRIC_CALLS.labels(spec.fabric, "detach").inc()
            rlog.info("detaching", host=host)
            try:
                op = await asyncio.to_thread(backend.detach, spec.device_id, host)
                await follow(backend, op, float(fabric.operation_timeout_seconds))
            except FabricError as exc:
                metrics.FABRIC_ERRORS.labels(spec.fabric, exc.kind).inc()
                # The device stays tainted and attached; the next try re-reads the fabric.
                await ctl.write_status(
                    name,
                    {"phase": "Detaching", "error": str(exc)},
                    [condition(names.READY, False, "DetachFailed", str(exc))],
                )
                raise kopf.TemporaryError(
                    str(exc), delay=exc.retry_after or min(30, 2**retry)
                ) from exc
