"""The redfish-composition backend against the fabric emulator (a real Redfish server)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import requests

from composable_dra.fabric import backend as b
from composable_dra.fabric import errors as fe
from composable_dra.fabric.connection import Connection
from composable_dra.fabric.redfish import RedfishCompositionBackend
from composable_dra.model.health import Reason
from fabric_emulator.testing import EmulatorProcess
from testbed.wait import wait_for


@pytest.fixture
def fabric(emu: EmulatorProcess) -> Iterator[RedfishCompositionBackend]:
    emu.reset()
    emu.configure(async_polls=1)
    backend = RedfishCompositionBackend(emu.url, "admin", "admin")
    yield backend
    backend.close()


def finish(fabric: RedfishCompositionBackend, op: b.Operation | None) -> b.OperationStatus:
    assert op is not None

    def ended() -> b.OperationStatus | None:
        status = fabric.operation_status(op)
        return None if status.state == "running" else status

    result = wait_for(ended, 20, "the task to end")
    assert isinstance(result, b.OperationStatus)
    return result


def test_inventory_attach_detach(fabric: RedfishCompositionBackend) -> None:
    inv = fabric.inventory()
    assert set(inv.hosts) == {"node-1", "node-2", "node-3"}
    assert inv.zones["zone-1"].hosts == {"node-1", "node-2"}
    assert inv.devices["gpu-1"].state == "free"
    assert finish(fabric, fabric.attach("gpu-1", "node-1")).state == "done"
    after = fabric.inventory()  # started after the attach finished: it must show it
    assert (after.devices["gpu-1"].state, after.devices["gpu-1"].host) == ("attached", "node-1")
    with pytest.raises(fe.InUseError):
        fabric.attach("gpu-1", "node-2")
    assert finish(fabric, fabric.detach("gpu-1", "node-1")).state == "done"
    assert fabric.inventory().devices["gpu-1"].state == "free"


def test_targeted_reads_agree_with_the_inventory(fabric: RedfishCompositionBackend) -> None:
    inv = fabric.inventory()
    assert fabric.hosts() == inv.hosts
    assert fabric.device("gpu-1") == inv.devices["gpu-1"]
    assert fabric.device("no-such-block") is None
    assert fabric.device("system-node-1") is None  # a host's own block is no device
    assert finish(fabric, fabric.attach("gpu-1", "node-2")).state == "done"
    attached = fabric.device("gpu-1")
    assert attached is not None
    assert (attached.state, attached.host, attached.uuid) == (
        "attached",
        "node-2",
        inv.devices["gpu-1"].uuid,
    )
    assert attached == fabric.inventory().devices["gpu-1"]


def test_a_failed_task_is_reported_as_failed(
    fabric: RedfishCompositionBackend, emu: EmulatorProcess
) -> None:
    emu.add_fault({"kind": "task_failure", "path": "AddResourceBlock", "count": 1})
    status = finish(fabric, fabric.attach("gpu-2", "node-1"))
    assert status.state == "failed"
    assert status.message
    assert fabric.inventory().devices["gpu-2"].state == "free"


def test_faults_become_typed_errors(
    fabric: RedfishCompositionBackend, emu: EmulatorProcess
) -> None:
    emu.add_fault({"kind": "status503", "path": "AddResourceBlock", "count": 1, "retry_after": 2})
    with pytest.raises(fe.BusyError) as busy:
        fabric.attach("gpu-3", "node-1")
    assert busy.value.retry_after == 2.0
    emu.add_fault({"kind": "drop_before", "path": "AddResourceBlock", "count": 1})
    with pytest.raises(fe.TransientError):
        fabric.attach("gpu-3", "node-1")
    assert fabric.inventory().devices["gpu-3"].state == "free"  # nothing was applied


def test_concurrent_reads_share_one_fresh_read(
    fabric: RedfishCompositionBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = []
    real = fabric._read_inventory

    def counted() -> b.Inventory:
        reads.append(1)
        return real()

    monkeypatch.setattr(fabric, "_read_inventory", counted)
    results: list[b.Inventory] = []
    threads = [
        threading.Thread(target=lambda: results.append(fabric.inventory())) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 8
    assert 1 <= len(reads) <= 3  # one read, and at most one more for those who asked during it


@pytest.mark.parametrize(
    "device_id",
    ["../../../Systems/node-1", "gpu-1/../gpu-2", "gpu-1?$expand=*", "gpu-1#x", "gpu 1", ".."],
)
def test_a_device_id_cannot_name_another_resource(
    fabric: RedfishCompositionBackend, emu: EmulatorProcess, device_id: str
) -> None:
    # The CRD refuses such ids; the backend refuses them again before building a URL.
    for call in (
        lambda: fabric.device(device_id),
        lambda: fabric.attach(device_id, "node-1"),
        lambda: fabric.detach(device_id, "node-1"),
    ):
        with pytest.raises(fe.FabricError, match="invalid device id"):
            call()
    assert all(blk["system"] is None for blk in emu.state()["blocks"].values())


def _pool_full_warnings(
    emu: EmulatorProcess, caplog: pytest.LogCaptureFixture, connections: int, calls: int
) -> int:
    """Warnings of a connection dropped because the pool was full, after ``calls``
    device reads at once (each held 0.3 s by the emulator, so that they overlap)."""
    emu.reset()
    emu.add_fault(
        {"kind": "latency", "method": "GET", "path": "ResourceBlocks/gpu-1$", "latency": 0.3}
    )
    backend = RedfishCompositionBackend(
        emu.url, "admin", "admin", connection=Connection(connections=connections)
    )
    try:
        backend.device("gpu-2")  # log in first: the calls below only read
        start = threading.Barrier(calls)

        def read() -> None:
            start.wait(timeout=30)
            assert backend.device("gpu-1") is not None

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
            threads = [threading.Thread(target=read) for _ in range(calls)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        return sum("Connection pool is full" in r.getMessage() for r in caplog.records)
    finally:
        backend.close()
        emu.reset()


def test_concurrent_calls_up_to_its_connections_keep_their_connections(
    emu: EmulatorProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # The emulator is plain http: the DMTF client sizes only its https pool.
    assert _pool_full_warnings(emu, caplog, connections=24, calls=24) == 0
    # What requests' default of 10 did with the operator's concurrent attaches.
    assert _pool_full_warnings(emu, caplog, connections=10, calls=24) > 0


def test_a_block_status_set_in_the_emulator_is_the_device_fault(
    fabric: RedfishCompositionBackend, emu: EmulatorProcess
) -> None:
    assert fabric.inventory().devices["gpu-1"].fault is None
    emu.set_block_status("gpu-1", health="Critical")
    assert fabric.inventory().devices["gpu-1"].fault is Reason.FABRIC_CRITICAL
    emu.set_block_status("gpu-1", state="Absent")
    assert fabric.inventory().devices["gpu-1"].fault is Reason.FABRIC_ABSENT
    emu.set_block_status("gpu-1")  # OK again
    assert fabric.inventory().devices["gpu-1"].fault is None
    assert fabric.inventory().devices["gpu-2"].fault is None


def _sessions(emu: EmulatorProcess) -> list[str]:
    answer = requests.get(
        f"{emu.url}/redfish/v1/SessionService/Sessions", auth=("admin", "admin"), timeout=10
    )
    answer.raise_for_status()
    return [m["@odata.id"] for m in answer.json()["Members"]]


def test_an_expired_session_logs_in_again_and_repeats_the_request_once(
    fabric: RedfishCompositionBackend, emu: EmulatorProcess
) -> None:
    others = set(_sessions(emu))  # other tests' backends, if any are still open
    assert fabric.hosts()
    (first,) = set(_sessions(emu)) - others
    # The service forgets the session (it expired, or the manager restarted).
    requests.delete(f"{emu.url}{first}", auth=("admin", "admin"), timeout=10).raise_for_status()
    assert fabric.device("gpu-1") is not None  # answered: a 401, a login, the same request
    (second,) = set(_sessions(emu)) - others
    assert second != first
