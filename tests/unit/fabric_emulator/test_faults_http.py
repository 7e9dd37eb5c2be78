"""Every fault kind, injected through the admin API and at start, over real HTTP."""

from __future__ import annotations

import time

import pytest
import requests

from fabric_emulator.testing import EmulatorProcess

from .conftest import ROOT, Client, message_ids

ADD = "AddResourceBlock$"


def test_latency(client: Client, emu: EmulatorProcess) -> None:
    emu.add_fault({"kind": "latency", "latency": 0.4, "path": "/Systems$", "count": 1})
    started = time.monotonic()
    assert client.get(f"{ROOT}/Systems").status_code == 200
    assert time.monotonic() - started >= 0.4
    started = time.monotonic()
    assert client.get(f"{ROOT}/Systems").status_code == 200
    assert time.monotonic() - started < 0.4  # used up
    assert emu.faults()[0]["fired"] == 1


def test_status503_with_retry_after(client: Client, emu: EmulatorProcess) -> None:
    emu.add_fault({"kind": "status503", "path": ADD, "count": 2, "retry_after": 7})
    for _ in range(2):
        resp = client.attach("node-1", "gpu-1")
        assert resp.status_code == 503
        assert resp.headers["Retry-After"] == "7"
        assert message_ids(resp) == ["Base.1.19.ServiceTemporarilyUnavailable"]
        assert "Retry in 7 seconds" in resp.json()["error"]["message"]
    assert emu.state()["blocks"]["gpu-1"]["state"] == "Unused"
    assert client.attach("node-1", "gpu-1").status_code == 200


def test_status500(client: Client, emu: EmulatorProcess) -> None:
    emu.add_fault({"kind": "status500", "method": "GET", "path": "/Chassis$", "count": 1})
    resp = client.get(f"{ROOT}/Chassis")
    assert resp.status_code == 500 and message_ids(resp) == ["Base.1.19.InternalError"]
    assert client.get(f"{ROOT}/Chassis").status_code == 200


def test_conflict409(client: Client, emu: EmulatorProcess) -> None:
    emu.add_fault({"kind": "conflict409", "method": "POST", "path": ADD, "count": 1})
    resp = client.attach("node-1", "gpu-1")
    assert resp.status_code == 409 and message_ids(resp) == ["Base.1.19.ResourceInUse"]
    assert emu.state()["blocks"]["gpu-1"]["state"] == "Unused"
    assert client.get(f"{ROOT}/Systems").status_code == 200  # POST only


@pytest.mark.parametrize(
    ("kind", "system", "retried"),
    [
        ("drop_before", None, 200),  # nothing was applied: the retry attaches
        # applied, then the connection dropped: the retry sees the block in use, so the
        # client must re-read state instead
        ("drop_after", "node-1", 409),
    ],
)
def test_a_dropped_connection(
    client: Client, emu: EmulatorProcess, kind: str, system: str | None, retried: int
) -> None:
    emu.add_fault({"kind": kind, "path": ADD, "count": 1})
    with pytest.raises(requests.ConnectionError):
        client.attach("node-1", "gpu-4")
    assert emu.state()["blocks"]["gpu-4"]["system"] == system
    assert client.attach("node-1", "gpu-4").status_code == retried


def test_task_failure(client: Client, emu: EmulatorProcess) -> None:
    emu.add_fault({"kind": "task_failure", "path": ADD, "count": 1})
    resp = client.attach("node-2", "gpu-5")  # the service is synchronous: forced to a task
    assert resp.status_code == 202
    monitor = resp.headers["Location"]
    assert emu.state()["blocks"]["gpu-5"]["state"] == "Composing"
    final = client.get(monitor)
    assert final.status_code == 500
    assert message_ids(final) == ["Base.1.19.OperationFailed"]
    task = client.get(resp.json()["@odata.id"]).json()
    assert task["TaskState"] == "Exception" and task["TaskStatus"] == "Critical"
    ids = [m["MessageId"] for m in task["Messages"]]
    assert ids == [
        "TaskEvent.1.0.TaskStarted",
        "Base.1.19.OperationFailed",
        "TaskEvent.1.0.TaskAborted",
    ]
    assert emu.state()["blocks"]["gpu-5"]["state"] == "Unused"
    assert client.get(monitor).status_code == 404
    assert client.attach("node-2", "gpu-5").status_code == 200


def test_async_task_hits_a_conflict_at_completion(client: Client, emu: EmulatorProcess) -> None:
    """A detach task whose block is removed meanwhile by PATCH cannot happen: the pending
    detach holds the block, so the PATCH is refused with 409."""
    assert client.attach("node-1", "gpu-1").status_code == 200
    emu.configure(async_polls=2)
    resp = client.detach("node-1", "gpu-1")
    assert resp.status_code == 202
    patch = client.patch(f"{ROOT}/Systems/node-1", {"Links": {"ResourceBlocks": []}})
    assert patch.status_code == 409
    monitor = resp.headers["Location"]
    assert client.get(monitor).status_code == 202
    assert client.get(monitor).status_code == 200
    assert emu.state()["blocks"]["gpu-1"]["state"] == "Unused"


def test_probability_with_seed_is_reproducible(client: Client, emu: EmulatorProcess) -> None:
    def outcomes() -> list[int]:
        emu.set_faults(
            [{"kind": "status500", "path": "/Managers$", "probability": 0.5, "seed": 42}]
        )
        return [client.get(f"{ROOT}/Managers").status_code for _ in range(20)]

    first = outcomes()
    assert first == outcomes()
    assert set(first) == {200, 500}


def test_faults_from_the_start_file() -> None:
    rules = [{"kind": "status503", "path": "/Systems$", "count": 1, "retry_after": 3}]
    with EmulatorProcess(faults=rules) as emu:
        c = Client(emu.url)
        first = c.get(f"{ROOT}/Systems")
        assert first.status_code == 503 and first.headers["Retry-After"] == "3"
        assert c.get(f"{ROOT}/Systems").status_code == 200


def test_admin_api_validates_and_removes_rules(emu: EmulatorProcess) -> None:
    with pytest.raises(Exception, match="400"):
        emu.add_fault({"kind": "meteor"})
    rule = emu.add_fault({"kind": "status500", "path": "x", "count": 1})
    assert [r["id"] for r in emu.faults()] == [rule["id"]]
    emu.admin("DELETE", f"faults/{rule['id']}")
    assert emu.faults() == []
    assert emu.configure(async_polls=4)["async_polls"] == 4
    emu.reset()
    assert emu.admin("GET", "config")["async_polls"] == 0
