"""Redfish tasks for asynchronous composition changes.

A change accepted asynchronously answers ``202 Accepted`` with ``Location`` (the task
monitor) and ``Retry-After``. The task stays ``Running`` for a configured number of polls
(a GET of its monitor or of its Task resource counts as one), then completes: the change
is applied, or the task ends in ``Exception`` with the failure's messages. The first GET of
the monitor after completion returns the operation's final response; later GETs of the
monitor answer 404, while the Task resource stays readable.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from composable_dra.k8s.timestamps import now_rfc3339
from fabric_emulator import messages
from fabric_emulator.resources import ROOT, odata_type
from fabric_emulator.state import RedfishError

TASKS = f"{ROOT}/TaskService/Tasks"
MONITORS = f"{ROOT}/TaskService/TaskMonitors"

Complete = Callable[[], Awaitable[tuple[int, dict[str, Any]]]]


@dataclass
class Task:
    id: str
    method: str
    target: str
    body: dict[str, Any]
    polls_left: int
    complete: Complete
    abort: Callable[[], None]
    failure: list[dict[str, Any]] | None = None
    state: str = "Running"
    start: str = field(default_factory=now_rfc3339)
    end: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    result: tuple[int, dict[str, Any]] | None = None
    monitor_done: bool = False

    @property
    def done(self) -> bool:
        return self.state in ("Completed", "Exception")

    @property
    def monitor_uri(self) -> str:
        return f"{MONITORS}/{self.id}"

    @property
    def uri(self) -> str:
        return f"{TASKS}/{self.id}"


def render(task: Task) -> dict[str, Any]:
    status = "OK"
    if task.state == "Exception":
        status = "Critical"
    out: dict[str, Any] = {
        "@odata.id": task.uri,
        "@odata.type": odata_type("Task"),
        "Id": task.id,
        "Name": f"Task {task.id}",
        "TaskState": task.state,
        "TaskStatus": status,
        "StartTime": task.start,
        "PercentComplete": 100 if task.done else 50,
        "TaskMonitor": task.monitor_uri,
        "Messages": list(task.messages),
        "Payload": {
            "HttpOperation": task.method,
            "TargetUri": task.target,
            "JsonBody": json.dumps(task.body),
            "HttpHeaders": ["Content-Type: application/json"],
        },
    }
    if task.end:
        out["EndTime"] = task.end
    return out


class TaskStore:
    """All tasks of the service; keeps the newest ``limit`` (completed ones go first)."""

    def __init__(self, limit: int = 200) -> None:
        self.tasks: dict[str, Task] = {}
        self.limit = limit
        self._ids = itertools.count(1)

    def create(
        self,
        method: str,
        target: str,
        body: dict[str, Any],
        polls: int,
        complete: Complete,
        abort: Callable[[], None],
        failure: list[dict[str, Any]] | None = None,
    ) -> Task:
        tid = str(next(self._ids))
        task = Task(
            id=tid,
            method=method,
            target=target,
            body=body,
            polls_left=polls,
            complete=complete,
            abort=abort,
            failure=failure,
        )
        task.messages.append(messages.message("TaskEvent", "TaskStarted", tid))
        self.tasks[tid] = task
        self._trim()
        return task

    def _trim(self) -> None:
        while len(self.tasks) > self.limit:
            victim = next((t for t in self.tasks.values() if t.done), None)
            if victim is None:
                return
            del self.tasks[victim.id]

    async def poll(self, task: Task) -> None:
        """Count one poll; complete the task when its polls are used up.

        The caller holds the composition lock."""
        if task.done:
            return
        task.polls_left -= 1
        if task.polls_left > 0:
            return
        await self.finish(task)

    async def finish(self, task: Task) -> None:
        if task.done:
            return
        if task.failure is not None:
            task.abort()
            err = RedfishError(500, *task.failure)
            self._fail(task, err)
            return
        try:
            task.result = await task.complete()
        except RedfishError as err:
            task.abort()
            self._fail(task, err)
            return
        task.state = "Completed"
        task.end = now_rfc3339()
        task.messages.append(messages.message("TaskEvent", "TaskCompletedOK", task.id))

    def _fail(self, task: Task, err: RedfishError) -> None:
        task.state = "Exception"
        task.end = now_rfc3339()
        task.result = (err.status, err.body())
        task.messages.extend(err.messages)
        task.messages.append(messages.message("TaskEvent", "TaskAborted", task.id))

    def clear(self) -> None:
        for task in self.tasks.values():
            if not task.done:
                task.abort()
        self.tasks.clear()
