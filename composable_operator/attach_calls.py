"""This process's attach requests, by resource uid, and their record in status.

An attach request is recorded in status.pendingAttach before it is sent (and its task
once the fabric answers), and kept here while it runs: a resource deleted mid-attach is
detached only after that attach landed or ended, in this process or, from the record,
after a restart. ``AttachCalls`` owns the calls; the record goes out through the
resource's ``StatusWrites``, in order with its other writes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from composable_dra.fabric.backend import FabricBackend, Operation
from composable_dra.fabric.errors import FabricError, OperationFailedError, TransientError
from composable_dra.fabric.errors import NotFoundError as FabricNotFoundError
from composable_dra.k8s.kube import JSON, NotFound
from composable_dra.process import logs
from composable_operator.reconcile import AttachRecord, CallState
from composable_operator.status_writes import StatusWrites

log = logs.get(__name__)

# Seconds an attach request may take to be answered before it is recorded in status on
# its own (the answer's record is the usual one write).
RECORD_AFTER = 0.5


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


@dataclass
class AttachCalls:
    """The attach requests of this process, by resource uid (see the module docstring)."""

    statuses: StatusWrites
    _calls: dict[str, AttachCall] = field(default_factory=dict)

    def get(self, uid: str) -> AttachCall | None:
        return self._calls.get(uid)

    def state(self, uid: str) -> CallState | None:
        call = self._calls.get(uid)
        return call.state() if call is not None else None

    def pending_task(self, uid: str, record: AttachRecord | None) -> Operation | None:
        return pending_task(self._calls.get(uid), record)

    def release(self, uid: str) -> None:
        """The resource is gone: nothing of it is in flight any more."""
        self._calls.pop(uid, None)

    def run(self, uid: str, request: Coroutine[Any, Any, Operation | None]) -> AttachCall:
        """Run ``request`` as the resource's attach call, apart from its caller."""
        call = AttachCall(asyncio.ensure_future(request))
        self._calls[uid] = call
        return call

    def record(
        self,
        name: str,
        record: AttachRecord | None,
        extra: JSON,
        conditions: list[JSON] | None = None,
    ) -> asyncio.Task[None]:
        """Write status.pendingAttach (with ``extra`` fields) in the background, in order
        with the resource's other writes: these writes stay off the attach's path (this
        process knows all of it from memory; a restart that misses a task's record only
        waits longer)."""
        fields = {**extra, "pendingAttach": record.to_json() if record else None}
        task = self.statuses.queue(name, fields, conditions or [])

        def done(t: asyncio.Task[None]) -> None:
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None and not isinstance(exc, NotFound):  # gone: nothing to record
                log.warning("status.pendingAttach not written", resource=name, exc_info=exc)

        task.add_done_callback(done)
        return task

    def start(
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
                self.record(name, record, attaching, conditions or [])
            try:
                op = await sent
            except FabricError:
                self.statuses.drop(name, "pendingAttach")  # answered: nothing is in flight
                raise
            # Each step of an attach has its log line, for where the time goes
            # (docs/attach-flow.md, Timing).
            log.info("attach answered", resource=name, task=op.monitor if op else None)
            if op is not None:  # done at once: the next status write drops the record
                with_task = AttachRecord(host, record.requested_at, op.monitor, op.task)
                self.record(name, with_task, attaching, [] if early else conditions or [])
            elif early:
                self.statuses.drop(name, "pendingAttach")
            return op

        return self.run(uid, run())

    async def end(
        self,
        uid: str,
        name: str,
        backend: FabricBackend,
        op: Operation | None,
        limit: float,
    ) -> None:
        """Follow an attach operation to its end, then forget it (here, and in status with
        the resource's next status write: the step that follows always writes one; a
        restart before that write finds a task that ended, which it follows at once).

        Raises OperationFailedError when the fabric reports the task failed.
        """
        try:
            if op is not None:
                await follow(backend, op, limit)
        except FabricNotFoundError:
            pass  # monitor and task gone: it ended; the fabric shows how
        except OperationFailedError:
            self._ended(uid, name)
            raise
        self._ended(uid, name)

    def _ended(self, uid: str, name: str) -> None:
        call = self._calls.get(uid)
        if call is not None:
            call.ended = True
        self.statuses.drop(name, "pendingAttach")
