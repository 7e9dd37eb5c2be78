"""The operator's bookkeeping of its own attach requests (attach_calls.AttachCalls): recorded
in status as they go out, their task recorded once answered, forgotten once ended; the
request outlives the daemon that sent it. Kube and the fabric are fakes."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from composable_dra.fabric.backend import Operation, OperationStatus
from composable_dra.fabric.errors import InUseError, NotFoundError, OperationFailedError
from composable_dra.k8s.kube import JSON
from composable_operator import attach_calls
from composable_operator.attach_calls import AttachCall
from composable_operator.controller import Controller
from composable_operator.reconcile import AttachRecord, parse_attach_record

MONITOR = "/redfish/v1/TaskService/TaskMonitors/3"


class FakeKube:
    def __init__(self) -> None:
        self.status: JSON = {}
        self.log: list[str] = []
        self.wrote = threading.Event()  # set by every status write

    def apply(self, _path: str, body: JSON, _manager: str) -> JSON:
        # A server-side apply of everything the operator owns: what it leaves out goes.
        self.status = dict(body["status"])
        self.log.append(f"status {sorted(body['status'])}")
        self.wrote.set()
        return {"status": self.status}


class FakeBackend:
    def __init__(self, kube: FakeKube, answer: Operation | Exception | None) -> None:
        self.kube, self.answer = kube, answer
        self.states: list[OperationStatus | Exception] = []
        self.release = threading.Event()
        self.release.set()

    def attach(self, device_id: str, host_id: str) -> Operation | None:
        self.release.wait(5)
        self.kube.log.append(f"attach {device_id} {host_id}")
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def operation_status(self, op: Operation) -> OperationStatus:
        state = self.states.pop(0)
        if isinstance(state, Exception):
            raise state
        return state


def controller(kube: FakeKube) -> Controller:
    return Controller(kube, fabrics=None)  # type: ignore[arg-type]


def held_attach() -> tuple[FakeKube, Controller, FakeBackend, AttachCall]:
    """An attach request the fabric holds until ``backend.release`` is set."""
    kube = FakeKube()
    ctl = controller(kube)
    backend = FakeBackend(kube, Operation(MONITOR, "/t/3", retry_after=0))
    backend.release.clear()
    call = ctl.attaches.start("uid", "r1", backend, "gpu-1", "h1")  # type: ignore[arg-type]
    return kube, ctl, backend, call


def test_the_request_and_its_task_are_recorded_then_forgotten_once_ended() -> None:
    async def main() -> None:
        kube = FakeKube()
        ctl = controller(kube)
        backend = FakeBackend(kube, Operation(MONITOR, "/t/3", retry_after=0))
        attaching = [{"type": "Attached", "status": "False", "reason": "Attaching"}]
        call = ctl.attaches.start("uid", "r1", backend, "gpu-1", "h1", attaching)  # type: ignore[arg-type]
        assert ctl.attaches.get("uid") is call and call.state() == "running"
        op = await call.request
        await ctl.statuses.written("r1")
        assert kube.status["phase"] == "Attaching"
        record = parse_attach_record(kube.status)
        assert record is not None and (record.monitor, record.task) == (MONITOR, "/t/3")
        assert call.state() == "task" and call.operation() == op
        backend.states = [OperationStatus("running", retry_after=0), OperationStatus("done")]
        await ctl.attaches.end("uid", "r1", backend, op, 10)  # type: ignore[arg-type]
        await ctl.statuses.written("r1")
        assert call.state() == "ended"
        # The request and its task in one write (the fabric answered at once); forgotten
        # with the step's next write, which goes out anyway: none of its own.
        assert [e for e in kube.log if e.startswith("status")] == [
            "status ['conditions', 'pendingAttach', 'phase']"
        ]
        await ctl.statuses.write("r1", {"deviceUUID": "GPU-1"})
        assert "pendingAttach" not in kube.status and kube.status["phase"] == "Attaching"

    asyncio.run(main())


def test_a_slow_answer_gets_the_request_recorded_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A restart while the request is on its way finds it recorded (its detach waits for it
    # to land); the answer's task is recorded once it comes.
    monkeypatch.setattr(attach_calls, "RECORD_AFTER", 0.01)

    async def main() -> None:
        kube, ctl, backend, call = held_attach()
        assert await asyncio.to_thread(kube.wrote.wait, 5)  # the early record
        record = parse_attach_record(kube.status)
        assert record is not None and record.monitor is None and call.state() == "running"
        backend.release.set()
        await call.request
        await ctl.statuses.written("r1")
        record = parse_attach_record(kube.status)
        assert record is not None and record.monitor == MONITOR
        written = "status ['pendingAttach', 'phase']"
        assert kube.log == [written, "attach gpu-1 h1", written]

    asyncio.run(main())


def test_a_failed_task_is_forgotten_and_reported() -> None:
    async def main() -> None:
        kube = FakeKube()
        ctl = controller(kube)
        backend = FakeBackend(kube, Operation(MONITOR, "/t/3", retry_after=0))
        call = ctl.attaches.start("uid", "r1", backend, "gpu-1", "h1")  # type: ignore[arg-type]
        op = await call.request
        backend.states = [OperationStatus("failed", "no")]
        with pytest.raises(OperationFailedError):
            await ctl.attaches.end("uid", "r1", backend, op, 10)  # type: ignore[arg-type]
        await ctl.statuses.written("r1")
        owned = ctl.statuses.owned("r1")
        assert call.state() == "ended" and owned is not None and "pendingAttach" not in owned

    asyncio.run(main())


def test_a_task_whose_monitor_and_task_are_gone_has_ended() -> None:
    async def main() -> None:
        kube = FakeKube()
        ctl = controller(kube)
        backend = FakeBackend(kube, None)
        backend.states = [NotFoundError("gone")]
        await ctl.attaches.end("uid", "r1", backend, Operation(MONITOR, retry_after=0), 10)  # type: ignore[arg-type]
        await ctl.statuses.written("r1")
        assert "pendingAttach" not in kube.status

    asyncio.run(main())


def test_a_refused_request_leaves_nothing_in_flight() -> None:
    async def main() -> None:
        kube = FakeKube()
        ctl = controller(kube)
        backend = FakeBackend(kube, InUseError("taken"))
        call = ctl.attaches.start("uid", "r1", backend, "gpu-1", "h1")  # type: ignore[arg-type]
        with pytest.raises(InUseError):
            await call.request
        await ctl.statuses.written("r1")
        assert call.state() == "ended" and "pendingAttach" not in (ctl.statuses.owned("r1") or {})
        await ctl.statuses.write("r1", {"error": "taken"})  # what the daemon writes next
        assert "pendingAttach" not in kube.status

    asyncio.run(main())


def test_the_request_outlives_the_daemon_that_started_it() -> None:
    # kopf cancels a resource's daemon as soon as the resource is deleted; the request
    # must go on, and its answer stay there for the detach.
    async def main() -> None:
        _, _, backend, call = held_attach()

        async def daemon() -> Any:
            return await asyncio.shield(call.request)

        task = asyncio.ensure_future(daemon())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert call.state() == "running"
        backend.release.set()
        await asyncio.wait([call.request], timeout=5)
        assert call.state() == "task"

    asyncio.run(main())


def test_record_writes_land_in_the_order_they_were_made() -> None:
    # The record of a task, written slowly, must not land after the clear made later.
    class SlowFirstKube(FakeKube):
        def __init__(self) -> None:
            super().__init__()
            self.first = threading.Event()

        def apply(self, _path: str, body: JSON, _manager: str) -> JSON:
            if not self.first.is_set():
                self.first.set()
                time.sleep(0.3)
            return super().apply(_path, body, _manager)

    async def main() -> None:
        kube = SlowFirstKube()
        ctl = controller(kube)
        ctl.attaches.record("r1", AttachRecord("h1", 1.0, MONITOR), {}, [])
        ctl.attaches.record("r1", None, {}, [])
        await ctl.statuses.written("r1")
        assert "pendingAttach" not in kube.status
        assert len(kube.log) == 2

    asyncio.run(main())
