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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from api.v1alpha1 import API_VERSION, ComposableResourceSpec, FabricSpec
from composable_dra.fabric.backend import (
    Device,
    FabricBackend,
    FabricError,
    Operation,
    OperationFailedError,
    TransientError,
)
from composable_dra.fabric.backend import NotFoundError as FabricNotFoundError
from composable_dra.fabric.registry import Fabrics, host_for_node
from composable_dra.k8s.kube import JSON, Conflict, Kube, NotFound, path
from composable_dra.model import names
from composable_dra.process import logs
from composable_operator.cluster_cache import ClusterCache
from composable_operator.inventories import Inventories
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
from composable_operator.resource_events import ResourceEvents

PLURAL = "composableresources"
MANAGER = "composable-operator"
RESOURCE = "resource.k8s.io/v1"
log = logs.get(__name__)

# Seconds an attach request may take to be answered before it is recorded in status on
# its own (the answer's record is the usual one write).
RECORD_AFTER = 0.5

# What this operator writes of a ComposableResource's status (one server-side apply of
# all of it per write); the node's plugin owns DeviceVisible.
OWNED_FIELDS = (
    "phase",
    "error",
    "deviceUUID",
    "fabricHost",
    "attachedAt",
    "pendingAttach",
    "fabricDeviceID",
)
OWNED_CONDITIONS = (names.ATTACHED, names.READY)


def owned_status(status: Mapping[str, Any]) -> JSON:
    """The part of a status this operator owns."""
    out: JSON = {k: status[k] for k in OWNED_FIELDS if status.get(k) is not None}
    conditions = [c for c in status.get("conditions") or [] if c.get("type") in OWNED_CONDITIONS]
    if conditions:
        out["conditions"] = conditions
    return out


def with_changes(owned: Mapping[str, Any], fields: JSON, conditions: list[JSON]) -> JSON:
    """``owned`` with these fields (None drops one) and conditions (replacing those of
    their type)."""
    out: JSON = {k: v for k, v in owned.items() if k != "conditions"}
    for k, v in fields.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    merged = {c["type"]: c for c in owned.get("conditions") or []}
    merged.update({c["type"]: c for c in conditions})
    if merged:
        out["conditions"] = list(merged.values())
    return out


def _status_of(obj: Any) -> Mapping[str, Any]:
    status = obj.get("status") if isinstance(obj, Mapping) else None
    return status if isinstance(status, Mapping) else {}


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
    # What this operator owns of each resource's status, as last written or seen, and
    # the last status write under way, by resource name (kept in order).
    owned: dict[str, JSON] = field(default_factory=dict)
    status_writes: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # When a detach first waited for the node's plugin to drop its device, by resource
    # uid (monotonic; a restart starts the wait again, which only waits longer).
    unpublish_since: dict[str, float] = field(default_factory=dict)
    # ResourceClaims, our ResourceSlices and Nodes kept by watches (started by the
    # operator); None: every read lists.
    cache: ClusterCache | None = None
    # The Fabric daemon's latest inventory and hosts, per fabric (fabric_status.py).
    inventories: Inventories = field(default_factory=Inventories)
    # Devices a fabric that picks has attached for our resources (picks.py).
    picks: PickState = field(default_factory=PickState)
    # Wakes a resource's daemon on the resource's next event (resource_events.py).
    resource_events: ResourceEvents = field(default_factory=ResourceEvents)

    # -- status writes --------------------------------------------------------------

    def known_status(self, name: str, status: Mapping[str, Any]) -> None:
        """What this operator owns of a resource's status, as the live object shows it,
        unless this process has written it since (its own writes are newer)."""
        if name not in self.owned:
            self.owned[name] = owned_status(status)

    def forget_status(self, name: str) -> None:
        self.owned.pop(name, None)

    def set_status(self, name: str, status: JSON) -> None:
        """One server-side apply of everything this operator owns of the status (its
        fields and its conditions; the node's plugin keeps its own DeviceVisible). A field
        left out is dropped, since this manager owned it; one that another manager still
        shares (a merge patch of an older operator) is dropped with a merge patch."""
        status_path = path(API_VERSION, PLURAL, name, subresource="status")
        written = self.kube.apply(
            status_path,
            {
                "apiVersion": API_VERSION,
                "kind": "ComposableResource",
                "metadata": {"name": name},
                "status": status,
            },
            MANAGER,
        )
        left = [k for k in OWNED_FIELDS if k not in status and k in _status_of(written)]
        if left:
            self.kube.merge_patch(status_path, {"status": dict.fromkeys(left)})

    def _write(self, name: str, fields: JSON, conditions: list[JSON]) -> asyncio.Task[None]:
        """Queue one write of the resource's status with these changes, after the writes
        queued before it (each carries the whole owned status, so order matters)."""
        state = with_changes(self.owned.get(name) or {}, fields, conditions)
        self.owned[name] = state
        previous = self.status_writes.get(name)

        async def write() -> None:
            if previous is not None:
                await asyncio.wait([previous])  # in order, whatever became of it
            await asyncio.to_thread(self.set_status, name, state)

        task = asyncio.ensure_future(write())
        self.status_writes[name] = task

        def done(t: asyncio.Task[None]) -> None:
            if self.status_writes.get(name) is t:
                del self.status_writes[name]

        task.add_done_callback(done)
        return task

    async def write_status(
        self, name: str, fields: JSON, conditions: list[JSON] | None = None
    ) -> None:
        """One write: these fields (None drops one) and conditions over what this operator
        owns of the status already."""
        await self._write(name, fields, conditions or [])

    # -- attach requests --------------------------------------------------------------

    def _record(
        self, name: str, record: AttachRecord | None, extra: JSON, conditions: list[JSON]
    ) -> asyncio.Task[None]:
        """Write status.pendingAttach (with ``extra`` fields) in the background: these
        writes stay off the attach's path (this process knows all of it from memory; a
        restart that misses a task's record only waits longer)."""
        task = self._write(
            name, {**extra, "pendingAttach": record.to_json() if record else None}, conditions
        )

        def done(t: asyncio.Task[None]) -> None:
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None and not isinstance(exc, NotFound):  # gone: nothing to record
                log.warning("status.pendingAttach not written", resource=name, exc_info=exc)

        task.add_done_callback(done)
        return task

    def record_attach(
        self, uid: str, name: str, record: AttachRecord | None, extra: JSON
    ) -> asyncio.Task[None]:
        """Write status.pendingAttach (and ``extra``) in order with the other writes
        (picks.py)."""
        return self._record(name, record, extra, [])

    async def records_written(self, name: str) -> None:
        """Until the status writes under way for a resource are done."""
        while (task := self.status_writes.get(name)) is not None:
            await asyncio.wait([task])

    def start_attach(
        self,
        uid: str,
        name: str,
        backend: FabricBackend,
        device_id: str,
        host: str,
        conditions: list[JSON] | None = None,
    ) -> AttachCall:
        """Record the request in status (phase Attaching, with ``conditions``) and send
        it; record the fabric's task once it answers with one.

        Call with no await between the daemon's check that it is not stopped and this:
        a detach (which starts after the daemon is stopped) then finds the call here.
        """

        async def run() -> Operation | None:
            record = AttachRecord(host, time.time())
            attaching: JSON = {"phase": "Attaching", "error": None}
            sent = asyncio.ensure_future(asyncio.to_thread(backend.attach, device_id, host))
            # One write for the request and its answer (the task a restart follows): a
            # fabric answers a composition request at once, with a task or done. Only an
            # answer slower than RECORD_AFTER gets the request recorded before it, for a
            # restart meanwhile (its detach then waits for the request to land). Killed
            # before either write, the operator leaves a request no record names: the
            # fabric shows the block being composed, or a block composed later is adopted
            # as an orphan and detached when idle.
            early = not (await asyncio.wait([sent], timeout=RECORD_AFTER))[0]
            if early:
                self._record(name, record, attaching, conditions or [])
            try:
                op = await sent
            except FabricError:
                self._forget_record(name)  # answered: nothing is in flight
                raise
            # Each step of an attach has its log line, for where the time goes
            # (docs/attach-flow.md, Timing).
            log.info("attach answered", resource=name, task=op.monitor if op else None)
            if op is not None:  # done at once: the next status write drops the record
                with_task = AttachRecord(host, record.requested_at, op.monitor, op.task)
                self._record(name, with_task, attaching, [] if early else conditions or [])
            elif early:
                self._forget_record(name)
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
        """Follow an attach operation to its end, then forget it (here, and in status with
        the resource's next status write: the step that follows always writes one).

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
        self._forget_record(name)

    def _forget_record(self, name: str) -> None:
        """Drop status.pendingAttach from the next status write, which carries the step's
        outcome anyway (no write of its own: one write per step). A restart before that
        write finds a task that ended, which it follows at once to its end."""
        owned = self.owned.get(name)
        if owned is not None:
            self.owned[name] = {k: v for k, v in owned.items() if k != "pendingAttach"}

    # -- observations -----------------------------------------------------------------

    def node(self, name: str, consistent: bool = True) -> JSON | None:
        """The Node (slimmed, cluster_cache.slim_node, when from the cache): from the
        watch's cache, or (consistent, no cache, or not in it) from the API server."""
        cache = self.cache
        if not consistent and cache is not None and cache.nodes.synced():
            found = cache.nodes.get(name)
            if found is not None:
                return found
        return self.kube.get_or_none(path("v1", "nodes", name))

    def node_host(
        self, fabric_name: str, fabric: FabricSpec, backend: FabricBackend, node: JSON
    ) -> str | None:
        """The node's fabric host, from the hosts the last inventory pass (or the last
        miss) read; on a miss the hosts are read again, once (shared by concurrent
        callers), since a node may have joined the fabric since."""
        mapping = fabric.node_mapping
        known = self.inventories.hosts(fabric_name)
        if known is not None:
            host = host_for_node(node, mapping, known.hosts, known.by_uuid)
            if host is not None:
                return host
        known = self.inventories.set_hosts(fabric_name, backend.hosts())
        return host_for_node(node, mapping, known.hosts, known.by_uuid)

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
        device, host, node = await read_fabric(
            self, fabric, backend, spec, status, uid, name, consistent
        )
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
    fabric: FabricSpec,
    backend: FabricBackend,
    spec: ComposableResourceSpec,
    status: JSON,
    uid: str,
    name: str,
    consistent: bool = False,
) -> tuple[Device | None, str | None, JSON | None]:
    """What a decision about one resource needs: its device, read now (one request;
    picks.read_device); its node (from the watch's cache unless ``consistent``) and the
    node's fabric host (from the known hosts: Controller.node_host), with no read of
    every host per step."""

    def node_and_host() -> tuple[JSON | None, str | None]:
        node = ctl.node(spec.target_node, consistent)
        host = ctl.node_host(spec.fabric, fabric, backend, node) if node else None
        return node, host

    device, (node, host) = await asyncio.gather(
        read_device(ctl, backend, spec, status, uid, name), asyncio.to_thread(node_and_host)
    )
    return device, host, node


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
