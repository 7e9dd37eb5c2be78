"""The attach daemon (composable_operator.attach_daemon) without kopf: a fake live object,
stop flag, fabric and API server; what it records goes through actions.Recorder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from api.v1alpha1 import FabricSpec
from composable_dra.fabric.backend import Device, Host, Inventory, Operation, OperationStatus
from composable_dra.fabric.errors import BusyError
from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from composable_operator.actions import EventType
from composable_operator.attach_daemon import AttachDaemon
from composable_operator.cluster_cache import Changes, ClusterCache, claim_results, local_refs
from composable_operator.controller import Controller, ControllerSettings
from composable_operator.reconcile import DeviceHolder, next_delay
from composable_operator.resource_events import FALLBACK_LOOK_SECONDS
from composable_operator.status_writes import OWNED_CONDITIONS, OWNED_FIELDS

FABRIC = FabricSpec.model_validate(
    {
        "backend": "redfish-composition",
        "endpoint": "https://fabric.example",
        "credentialsSecret": {"name": "s", "namespace": "ns"},
        "operationTimeoutSeconds": 60,
    }
)
NODE = {"metadata": {"name": "n1"}, "status": {"nodeInfo": {"systemUUID": "uuid-h1"}}}


@dataclass
class Body:
    """The live object kopf keeps current: status writes land here at once."""

    meta: dict[str, Any] = field(
        default_factory=lambda: {
            "uid": "u1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "finalizers": [names.FINALIZER],
        }
    )
    spec: dict[str, Any] = field(
        default_factory=lambda: {"fabric": "fab", "deviceID": "gpu-1", "targetNode": "n1"}
    )
    status: dict[str, Any] = field(default_factory=dict)


class Stopped:
    """Stops after ``limit`` waits; records what the daemon waited for, and never sleeps."""

    def __init__(self, limit: int = 50) -> None:
        self.waits: list[float | None] = []
        self.limit = limit

    def __bool__(self) -> bool:
        return len(self.waits) >= self.limit

    def wait(self, timeout: float | None = None) -> Awaitable[None]:
        self.waits.append(timeout)
        return asyncio.sleep(0)


class Kube:
    """Status writes as the API server keeps them: a server-side apply owns what it sent
    (a field it leaves out goes; conditions by type, the plugin's kept apart)."""

    def __init__(self, body: Body) -> None:
        self.body = body
        self.writes: list[str] = []
        self.node_reads = 0

    def merge_patch(self, _path: str, patch: JSON) -> JSON:
        self.writes.append("merge")
        for k, v in patch["status"].items():
            if v is None:
                self.body.status.pop(k, None)
            else:
                self.body.status[k] = v
        return {"status": dict(self.body.status)}

    def apply(self, _path: str, obj: JSON, _manager: str) -> JSON:
        self.writes.append("apply")
        sent = obj["status"]
        for k in OWNED_FIELDS:
            if k in sent:
                self.body.status[k] = sent[k]
            else:
                self.body.status.pop(k, None)
        theirs = [
            c for c in self.body.status.get("conditions", []) if c["type"] not in OWNED_CONDITIONS
        ]
        self.body.status["conditions"] = theirs + list(sent.get("conditions", []))
        return {"status": dict(self.body.status)}

    def get_or_none(self, _path: str) -> JSON | None:
        self.node_reads += 1
        return NODE


class Fabric:
    """One device; attach composes it at once, or (``task``) as a task that is done at
    its first look. ``errors`` fail the next device reads. Counts the reads."""

    def __init__(self, body: Body, plugin_sees: bool = True, task: bool = False) -> None:
        self.dev = Device("gpu-1", "H100", "z1", "GPU-1", "free")
        self.body, self.plugin_sees, self.task = body, plugin_sees, task
        self.attaches: list[tuple[str, str]] = []
        self.errors: list[Exception] = []
        self.device_reads = self.host_reads = 0

    def get(self, _name: str) -> tuple[FabricSpec, Fabric]:
        return FABRIC, self

    def hosts(self) -> dict[str, Host]:
        self.host_reads += 1
        return {"h1": Host("h1", "uuid-h1")}

    def device(self, _id: str) -> Device:
        self.device_reads += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.dev

    def attach(self, device_id: str, host: str) -> Operation | None:
        self.attaches.append((device_id, host))
        self.dev = replace(self.dev, state="attached", host=host)
        if self.plugin_sees:  # the node's plugin reports the GPU (its own status write)
            visible = {"type": names.DEVICE_VISIBLE, "status": "True"}
            self.body.status["conditions"] = [visible]
        return Operation("/tasks/1/monitor", "/tasks/1", retry_after=0) if self.task else None

    def operation_status(self, _op: Operation) -> OperationStatus:
        return OperationStatus("done")


def daemon(
    body: Body, fabric: Fabric, stopped: Stopped, holders: list[DeviceHolder] | None = None
) -> tuple[AttachDaemon, list[tuple[EventType, str, str]]]:
    ctl = Controller(Kube(body), fabrics=fabric, settings=ControllerSettings(online_poll=10))  # type: ignore[arg-type]
    events: list[tuple[EventType, str, str]] = []
    d = AttachDaemon(
        ctl,
        body,
        stopped,
        lambda _key: holders or [],
        lambda kind, reason, message: events.append((kind, reason, message)),
        "r1",
    )
    return d, events


def test_a_free_device_is_attached_once_and_goes_online() -> None:
    body = Body()
    fabric = Fabric(body)
    stopped = Stopped(limit=3)
    d, events = daemon(body, fabric, stopped)
    asyncio.run(d.run())
    assert fabric.attaches == [("gpu-1", "h1")]
    assert body.status["phase"] == "Online" and body.status["deviceUUID"] == "GPU-1"
    assert "pendingAttach" not in body.status
    assert [r for _, r, _ in events] == ["Attaching", "Attached", "Online"]
    ready = {c["type"]: c["status"] for c in body.status["conditions"]}
    assert ready[names.READY] == "True" and ready[names.ATTACHED] == "True"
    # Online: the daemon checks again every online_poll, and writes nothing new.
    assert set(stopped.waits) == {10}


def test_no_attach_is_sent_before_the_finalizer_is_on_the_resource() -> None:
    # Deleted in that window, the resource would go with no detach handler run: an attach
    # sent then would leave the device composed to the node.
    body = Body()
    body.meta["finalizers"] = []
    fabric = Fabric(body)
    stopped = Stopped(limit=3)
    d, _ = daemon(body, fabric, stopped)
    asyncio.run(d.run())
    assert fabric.attaches == []
    # Looks in memory, no request; woken by the resource's events, else now and then.
    assert stopped.waits == [FALLBACK_LOOK_SECONDS] * 3
    body.meta["finalizers"] = [names.FINALIZER]
    stopped = Stopped(limit=3)
    d, _ = daemon(body, fabric, stopped)
    asyncio.run(d.run())
    assert fabric.attaches == [("gpu-1", "h1")]


def test_fabric_errors_back_off_and_are_recorded() -> None:
    body = Body()
    fabric = Fabric(body)
    fabric.errors = [BusyError("busy"), BusyError("busy"), BusyError("busy", retry_after=7)]
    stopped = Stopped(limit=3)
    d, _ = daemon(body, fabric, stopped)
    asyncio.run(d.run())
    first, second, asked = stopped.waits  # jittered: between half and all of 1 s, then 2 s
    assert first is not None and second is not None and asked == 7.0
    assert 0.5 <= first <= 1.0 and 1.0 <= second <= 2.0
    assert fabric.attaches == []
    attached = next(c for c in body.status["conditions"] if c["type"] == names.ATTACHED)
    assert attached["reason"] == "FabricBusy" and body.status["error"] == "busy"


def test_a_device_another_resource_holds_is_waited_for() -> None:
    body = Body()
    fabric = Fabric(body)
    stopped = Stopped(limit=1)
    older = DeviceHolder("r0", deleting=False, created="2025-01-01T00:00:00Z")
    d, _ = daemon(body, fabric, stopped, [older])
    asyncio.run(d.run())
    assert fabric.attaches == [] and stopped.waits == [1]
    [cond] = body.status["conditions"]
    assert (cond["type"], cond["reason"]) == (names.ATTACHED, "DeviceHeld")


def test_a_device_the_node_never_sees_fails_after_the_timeout() -> None:
    body = Body()
    fabric = Fabric(body, plugin_sees=False)
    stopped = Stopped(limit=200)
    d, events = daemon(body, fabric, stopped)
    d.started -= 61  # the attach began longer ago than the fabric's operation timeout
    asyncio.run(d.run())
    assert body.status["phase"] == "Failed"
    assert (EventType.WARNING, "AttachTimeout") in {(k, r) for k, r, _ in events}


def test_a_deleted_resource_stops_the_daemon_before_any_call() -> None:
    body = Body()
    body.meta["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    fabric = Fabric(body)
    d, events = daemon(body, fabric, Stopped())
    asyncio.run(d.run())
    assert fabric.attaches == [] and events == [] and body.status == {}


@pytest.mark.parametrize(
    ("failures", "retry_after", "nominal"),
    [(1, None, 1.0), (2, None, 2.0), (6, None, 30.0), (9, None, 30.0), (3, 7.0, 14.0)],
)
def test_next_delay_doubles_within_the_cap_unless_the_fabric_says(
    failures: int, retry_after: float | None, nominal: float
) -> None:
    # The suite's one policy (composable_dra/k8s/retry.py): half of each wait is jitter.
    waits = {next_delay(failures, 30, retry_after) for _ in range(20)}
    if retry_after is not None:
        assert waits == {retry_after}
    else:
        assert all(nominal / 2 <= w <= nominal for w in waits) and len(waits) > 1


def test_claim_results_and_local_refs_read_plain_objects() -> None:
    claim = {
        "metadata": {"namespace": "ns", "name": "c"},
        "status": {
            "allocation": {"devices": {"results": [{"driver": "d", "pool": "p", "device": "x"}]}}
        },
    }
    [r] = claim_results([claim, {"metadata": {"namespace": "ns", "name": "unallocated"}}])
    assert (r.claim, r.driver, r.pool, r.device) == ("ns/c", "d", "p", "x")
    slices = [
        {
            "spec": {
                "nodeName": node,
                "pool": {"name": node},
                "devices": [{"name": "gpu-a", "attributes": {"uuid": {"string": "GPU-ABC"}}}],
            }
        }
        for node in ("n1", "n2")
    ]
    assert local_refs(slices, "n1", "abc") == {("n1", "gpu-a")}
    assert local_refs(slices, "n1", "other") == set()


def test_changes_wake_a_waiter_and_a_change_before_the_wait_is_not_lost() -> None:
    async def main() -> None:
        changes = Changes()
        changes.bind(asyncio.get_running_loop())
        seen = changes.version
        changes.notify()  # as an informer thread would, before the wait began
        await asyncio.sleep(0)
        assert await changes.wait(seen, 5) is True
        seen = changes.version
        assert await changes.wait(seen, 0.01) is False
        waiter = asyncio.ensure_future(changes.wait(seen, 5))
        await asyncio.sleep(0)
        changes.notify()
        assert await waiter is True

    asyncio.run(main())


# -- cost per attach (docs/attach-flow.md, Scale) ---------------------------------------


@pytest.mark.parametrize(("task", "writes"), [(False, 2), (True, 3)])
def test_each_step_of_an_attach_is_one_status_write(task: bool, writes: int) -> None:
    # Phase Attaching with the record of the request and the fabric's task (none when
    # the fabric attached at once), Attached with the UUID, Online: one server-side apply
    # each (the finalizer is kopf's).
    body = Body()
    fabric = Fabric(body, task=task)
    d, _ = daemon(body, fabric, Stopped(limit=3))
    kube = d.ctl.kube
    asyncio.run(d.run())
    assert body.status["phase"] == "Online" and "pendingAttach" not in body.status
    assert kube.writes == ["apply"] * writes  # type: ignore[attr-defined]
    # The plugin's condition is its own: the operator's applies kept it.
    assert {c["type"] for c in body.status["conditions"]} == {
        names.ATTACHED,
        names.READY,
        names.DEVICE_VISIBLE,
    }


def test_steps_read_the_device_not_every_host_nor_the_node() -> None:
    # Three passes fail on the fabric before the attach; each reads the device again, but
    # the node's host comes from the hosts read once (and the node from the watch's cache).
    body = Body()
    fabric = Fabric(body)
    fabric.errors = [BusyError("busy")] * 3
    d, _ = daemon(body, fabric, Stopped(limit=6))
    cache = ClusterCache(d.ctl.kube, names.DRIVER)
    cache.nodes.informer.replace([NODE])  # as its list finds it
    d.ctl.reads.cache = cache
    asyncio.run(d.run())
    assert fabric.attaches == [("gpu-1", "h1")] and body.status["phase"] == "Online"
    assert fabric.host_reads == 1
    assert d.ctl.kube.node_reads == 0  # type: ignore[attr-defined]


def test_the_fabric_passes_inventory_spares_the_hosts_read() -> None:
    body = Body()
    fabric = Fabric(body)
    d, _ = daemon(body, fabric, Stopped(limit=3))
    hosts = {"h1": Host("h1", "uuid-h1")}
    d.ctl.inventories.publish("fab", Inventory(hosts, {}, {}), time.monotonic(), 30)
    asyncio.run(d.run())
    assert body.status["phase"] == "Online" and fabric.host_reads == 0


class FabricPasses(Stopped):
    """Each wait, the Fabric daemon's pass publishes a fresh inventory of the fabric."""

    def __init__(self, ctl: Controller, fabric: Fabric, limit: int) -> None:
        super().__init__(limit)
        self.ctl, self.fabric = ctl, fabric

    def wait(self, timeout: float | None = None) -> Awaitable[None]:
        inv = Inventory({"h1": Host("h1", "uuid-h1")}, {"gpu-1": self.fabric.dev}, {})
        self.ctl.inventories.publish("fab", inv, time.monotonic(), 30)
        return super().wait(timeout)


def test_online_resources_read_nothing_while_the_fabric_pass_shows_them_in_place() -> None:
    body = Body()
    fabric = Fabric(body)
    d, _ = daemon(body, fabric, Stopped(limit=3))
    asyncio.run(d.run())
    assert body.status["phase"] == "Online"
    reads, writes = fabric.device_reads, len(d.ctl.kube.writes)  # type: ignore[attr-defined]
    passes = FabricPasses(d.ctl, fabric, limit=20)
    d.stopped = passes
    asyncio.run(d.run())
    assert fabric.device_reads == reads and fabric.host_reads <= 1
    assert len(d.ctl.kube.writes) == writes  # type: ignore[attr-defined]
    assert set(passes.waits) == {10}
    # Detached behind our back: the next pass shows it, and the daemon reads the device
    # and attaches it again.
    fabric.dev = replace(fabric.dev, state="free", host=None)
    d.stopped = FabricPasses(d.ctl, fabric, limit=4)
    asyncio.run(d.run())
    assert fabric.attaches == [("gpu-1", "h1")] * 2
    assert fabric.device_reads > reads


def test_an_online_resource_reads_the_fabric_itself_when_no_pass_comes() -> None:
    body = Body()
    fabric = Fabric(body)
    d, _ = daemon(body, fabric, Stopped(limit=3))
    asyncio.run(d.run())
    reads = fabric.device_reads
    d.confirmed_at -= 2 * 30 + 10 + 1  # longer ago than two of the Fabric's poll intervals
    d.stopped = Stopped(limit=1)
    asyncio.run(d.run())
    assert fabric.device_reads == reads + 1


def test_the_plugins_report_spares_a_read_before_online() -> None:
    # The read after the attach shows the device attached but not yet seen by the node;
    # the plugin reports its UUID meanwhile: the daemon goes Online from that read.
    class ReportedWhileReading(Fabric):
        def device(self, _id: str) -> Device:
            dev = super().device(_id)
            if self.attaches:
                self.body.status["conditions"] = [{"type": names.DEVICE_VISIBLE, "status": "True"}]
            return dev

    body = Body()
    fabric = ReportedWhileReading(body, plugin_sees=False)
    d, events = daemon(body, fabric, Stopped(limit=4))
    asyncio.run(d.run())
    assert body.status["phase"] == "Online"
    assert [r for _, r, _ in events] == ["Attaching", "Attached", "Online"]
    assert fabric.device_reads == 2  # before the attach, and once after it
