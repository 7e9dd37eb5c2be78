"""The ComposableResource controller's machinery: status writes, attach calls, the reads a
decision needs, taints. The kopf handlers (handlers.py) and the attach daemon
(attach_daemon.py) drive it; the decisions are in reconcile.py.

- An attach request is recorded in status.pendingAttach before it is sent (and its task
  once the fabric answers), and kept in memory while it runs: a resource deleted
  mid-attach is detached only after that attach landed or ended, in this process or,
  from the record, after a restart.
- A detach taints the device NoSchedule with a DeviceTaintRule, re-checks claim
  allocations, then calls the fabric. A failed detach leaves the device tainted and
  attached.
Blocking calls (the fabric, the API server) run in threads, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from api.v1alpha1 import API_VERSION, ComposableResourceSpec, FabricSpec
from composable_dra import logs, names
from composable_dra.fabric.backend import (
    Device,
    FabricBackend,
    FabricError,
    Host,
    Operation,
    OperationFailedError,
    TransientError,
)
from composable_dra.fabric.backend import NotFoundError as FabricNotFoundError
from composable_dra.fabric.registry import Fabrics, host_for_node
from composable_dra.kube import JSON, Conflict, Kube, NotFound, path
from composable_operator.cluster_cache import ClusterCache
from composable_operator.picks import PickState, read_device
from composable_operator.reconcile import (
    UNPUBLISH_LIMIT_SECONDS,
    AttachRecord,
    CallState,
    ClaimResult,
    DetachObservation,
    attach_in_flight,
    referencing_claims,
)

PLURAL = "composableresources"
MANAGER = "composable-operator"
RESOURCE = "resource.k8s.io/v1"
log = logs.get(__name__)


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
    # ResourceClaims and our ResourceSlices kept by watches (started by the operator);
    # None: every read lists.
    cache: ClusterCache | None = None
    # Devices a fabric that picks has attached for our resources (picks.py).
    picks: PickState = field(default_factory=PickState)

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

    def record_attach(
        self, uid: str, name: str, record: AttachRecord | None, extra: JSON
    ) -> asyncio.Task[None]:
        """Write status.pendingAttach (and ``extra``) in order with the other writes."""
        return self._record(uid, name, record, extra)

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

    def claim_results(self, consistent: bool = True) -> list[ClaimResult]:
        """Every claim's allocation results: from the watch's cache, or (consistent, and
        whenever there is no cache) from the API server itself."""
        return self.cache_or_list().claim_results(consistent)

    def cache_or_list(self) -> ClusterCache:
        if self.cache is None:
            self.cache = ClusterCache(self.kube, self.settings.driver)  # not started: lists
        return self.cache

    def device_refs(
        self, spec: ComposableResourceSpec, device: Device | None, consistent: bool = True
    ) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        """The (pool, device) names under which the device can be allocated: all of them,
        and those of them in the target node's own slices."""
        if device is None:
            return set(), set()
        local = self.cache_or_list().local_refs(spec.target_node, device.uuid, consistent)
        return {(names.pool_name(spec.fabric, device.zone), spec.device_id)} | local, local

    async def observe_detach(
        self,
        backend: FabricBackend,
        fabric: FabricSpec,
        spec: ComposableResourceSpec,
        status: JSON,
        name: str,
        uid: str,
        record: AttachRecord | None,
        consistent: bool,
    ) -> tuple[DetachObservation, str | None, set[tuple[str, str]]]:
        """What decide_detach needs, read now; with the node's host and the device's names."""
        call = self.attaches.get(uid)
        in_flight = attach_in_flight(record, call.state() if call else None, time.time())
        device, hosts, node = await read_fabric(self, backend, spec, status, uid, name)
        host = host_for_node(node, fabric.node_mapping, hosts) if node else None
        if host is None and device is not None and device.state == "attached":
            host = device.host if status.get("fabricHost") == device.host else None
        refs, local = await asyncio.to_thread(self.device_refs, spec, device, consistent)
        rules = await asyncio.to_thread(self.taint_rules, name)
        results = await asyncio.to_thread(self.claim_results, consistent)
        observation = DetachObservation(
            device=device,
            host=host,
            tainted=len(rules) >= len(refs) > 0 or (bool(rules) and not refs),
            referencing_claims=referencing_claims(results, self.settings.driver, refs),
            force=spec.force_detach,
            attach=in_flight,
            published_locally=bool(local),
            node_exists=node is not None,
            unpublish_waited=time.monotonic() - self.unpublish_since.get(uid, time.monotonic()),
            unpublish_limit=self.settings.unpublish_limit,
        )
        return observation, host, refs

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
    ctl: Controller,
    backend: FabricBackend,
    spec: ComposableResourceSpec,
    status: JSON,
    uid: str,
    name: str,
) -> tuple[Device | None, dict[str, Host], JSON | None]:
    """What a decision about one resource needs, read now and at once: its device (one
    request; picks.read_device), the fabric's hosts (a read shared with concurrent
    callers) and its node."""
    device, hosts, node = await asyncio.gather(
        read_device(ctl, backend, spec, status, uid, name),
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
