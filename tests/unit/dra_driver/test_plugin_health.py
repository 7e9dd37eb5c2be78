"""The plugin's device health: the board (sources merged, debounced), the slice taints,
and the kubelet's NodeWatchResources stream over a real unix socket."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from api.dra_health.v1 import api_pb2 as hv1
from api.dra_health.v1 import api_pb2_grpc as hv1_grpc
from api.dra_health.v1alpha1 import api_pb2 as hv1alpha1
from api.dra_health.v1alpha1 import api_pb2_grpc as hv1alpha1_grpc
from api.pluginregistration.v1 import api_pb2 as reg
from api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from composable_dra.model.health import Health, HealthReport, Reason
from composable_dra.model.health_rules import TAINT_KEY
from dra_driver import health_stream
from dra_driver.checkpoint import Checkpoint, PreparedDevice
from dra_driver.grpc_server import PluginServer
from dra_driver.health_sources import HealthBoard
from dra_driver.health_taints import apply
from dra_driver.prepare import Preparer
from dra_driver.slices import desired_slices
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, gpu
from tests.unit.dra_driver.test_plugin_prepare import FakeApi


def bad(device: str, reason: Reason = Reason.FABRIC_CRITICAL) -> HealthReport:
    return HealthReport(device, Health.UNHEALTHY, reason, source="fabric")


class Source:
    name = "fake"

    def __init__(self) -> None:
        self.now: list[HealthReport] = []
        self.fail = False

    def reports(self) -> Iterable[HealthReport]:
        if self.fail:
            raise RuntimeError("unreadable")
        return list(self.now)


def test_board_merges_debounces_and_keeps_a_failing_source_s_last_word() -> None:
    source = Source()
    board = HealthBoard([source], lambda: ["gpu-a", "gpu-b"], recover_after=2)
    seen: list[list[HealthReport]] = []
    board.on_change(lambda _states, changed: seen.append(changed))
    assert board.poll_once() is False  # healthy devices arriving are no change
    source.now = [bad("gpu-a")]
    assert board.poll_once() and [r.device for r in seen[-1]] == ["gpu-a"]
    source.fail = True  # a blip is not a recovery
    assert board.poll_once() is False and board.states()["gpu-a"].fatal
    source.fail, source.now = False, []
    assert board.poll_once() is False and board.states()["gpu-a"].fatal  # 1 of 2
    assert board.poll_once() and board.states()["gpu-a"].health is Health.HEALTHY
    assert board.states()["gpu-b"].health is Health.HEALTHY


def test_slice_taints_on_the_unhealthy_device_only() -> None:
    devices = [gpu(0), gpu(1)]
    health = {devices[0].name: bad(devices[0].name)}
    (s,) = desired_slices(NODE, "uid", DRIVER, devices, 1, health=health)
    by_name = {d["name"]: d for d in s["spec"]["devices"]}
    assert [(t["key"], t["effect"]) for t in by_name[devices[0].name]["taints"]] == [
        (TAINT_KEY, "NoSchedule"),
        (TAINT_KEY, "NoExecute"),
    ]
    assert "taints" not in by_name[devices[1].name]
    layout = [{"devices": [{"name": "x", "taints": [{"key": "k"}]}]}]
    assert apply(layout, {"x": bad("x", Reason.FABRIC_WARNING)})[0]["devices"][0]["taints"] == [
        {"key": "k"},
        {"key": TAINT_KEY, "value": "FabricWarning", "effect": "NoSchedule"},
    ]
    assert apply(layout, {}) is layout


def prepared(pool: str, device: str, local: str) -> PreparedDevice:
    return PreparedDevice(
        request_names=["gpu"],
        pool_name=pool,
        device_name=device,
        local_name=local,
        uuid="u",
        cdi_device_ids=[],
    )


def test_entries_name_pool_gpus_by_their_allocated_identity() -> None:
    states = {"gpu-a": bad("gpu-a")}
    got = health_stream.entries(
        NODE,
        ["gpu-a", "gpu-b"],
        states,
        [prepared("fab/zone-1", "block-7", "gpu-a"), prepared("fab/zone-1", "block-9", "gone")],
    )
    assert [(e.pool, e.device, e.report.health) for e in got] == [
        ("fab/zone-1", "block-7", Health.UNHEALTHY),
        ("fab/zone-1", "block-9", Health.UNKNOWN),
        (NODE, "gpu-a", Health.UNHEALTHY),
        (NODE, "gpu-b", Health.HEALTHY),
    ]
    resp = health_stream.response(hv1, got, 1000.0, 30)
    first = resp.devices[0]
    assert (first.device.pool_name, first.health, first.last_updated_time) == (
        "fab/zone-1",
        hv1.UNHEALTHY,
        1000,
    )
    assert first.message.startswith("FabricCritical")
    assert first.health_check_timeout_seconds == 30


def test_the_plugin_resends_every_10_s_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from dra_driver.plugin_main import add_arguments

    def parse(*argv: str) -> float:
        p = argparse.ArgumentParser()
        add_arguments(p)
        resend: float = p.parse_args(["--node-name=node-a", *argv]).health_resend
        return resend

    monkeypatch.delenv("HEALTH_RESEND", raising=False)
    assert parse() == health_stream.RESEND == 10
    assert parse("--health-resend=2") == 2
    monkeypatch.setenv("HEALTH_RESEND", "0.5")
    assert parse() == 0.5


def test_the_timeout_sent_is_three_resends_in_whole_seconds() -> None:
    assert health_stream.timeout_for(health_stream.RESEND) == 30  # the kubelet's default
    assert health_stream.timeout_for(2) == 6
    assert health_stream.timeout_for(0.5) == 2  # rounded up: never shorter than 3 resends
    assert health_stream.timeout_for(0.01) == 1  # 0 would mean the kubelet's 30 s


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cdra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def empty_preparer(tmp: Path) -> Preparer:
    """A preparer of no devices (no CDI writer: nothing is prepared)."""
    return Preparer(
        DRIVER,
        NODE,
        FakeApi(),
        list,
        Checkpoint(tmp / "cp.json", "boot"),
        None,  # type: ignore[arg-type]
    )


def test_the_stream_sends_at_once_on_change_and_again_unprompted(short_tmp: Path) -> None:
    states: dict[str, HealthReport] = {}
    feed = health_stream.HealthFeed(lambda: health_stream.entries(NODE, ["gpu-a"], states, []))
    preparer = empty_preparer(short_tmp)
    server = PluginServer(
        preparer,
        DRIVER,
        short_tmp / "reg",
        short_tmp / "plugins",
        health_feed=feed,
        health_resend=2,
    )
    server.start()
    channels = []
    try:
        ch = grpc.insecure_channel(f"unix://{server.registration_path}")
        channels.append(ch)
        info = reg_grpc.RegistrationStub(ch).GetInfo(reg.InfoRequest(), timeout=5)
        assert "v1.DRAResourceHealth" in info.supported_versions
        assert "v1alpha1.DRAResourceHealth" in info.supported_versions
        svc = grpc.insecure_channel(f"unix://{server.service_path}")
        channels.append(svc)
        # v1alpha1 answers too, for older kubelets.
        old: Any = hv1alpha1_grpc.DRAResourceHealthStub(svc).NodeWatchResources(
            hv1alpha1.NodeWatchResourcesRequest(), timeout=5
        )
        assert next(old).devices[0].health == hv1alpha1.HEALTHY
        old.cancel()
        stream: Any = hv1_grpc.DRAResourceHealthStub(svc).NodeWatchResources(
            hv1.NodeWatchResourcesRequest(), timeout=30
        )
        first = next(stream).devices
        assert [d.health for d in first] == [hv1.HEALTHY]
        assert [d.health_check_timeout_seconds for d in first] == [6]  # three resends
        states["gpu-a"] = bad("gpu-a")
        threading.Timer(0.2, feed.changed).start()
        assert [d.health for d in next(stream).devices] == [hv1.UNHEALTHY]  # on the change
        stream.cancel()
    finally:
        for c in channels:
            c.close()
        server.stop(grace=0)


def test_a_quiet_feed_is_resent_every_resend_seconds() -> None:
    feed = health_stream.HealthFeed(lambda: health_stream.entries(NODE, ["gpu-a"], {}, []))
    servicer = health_stream.HealthStreamServicer(feed, hv1, resend=0.05)

    class Context:
        def __init__(self) -> None:
            self.sent = 0

        def is_active(self) -> bool:
            return self.sent < 3

    ctx = Context()
    for resp in servicer.NodeWatchResources(hv1.NodeWatchResourcesRequest(), ctx):
        ctx.sent += 1  # no change at all: three responses all the same
        # with the timeout of that resend period, not the default's
        assert [d.health_check_timeout_seconds for d in resp.devices] == [1]
    assert ctx.sent == 3


def test_the_fence_source_quarantines_the_fenced_gpu_of_this_node() -> None:
    from composable_dra.model.names import ANN_FENCE
    from dra_driver.fence_source import FenceSource

    devices = [gpu(0), gpu(1)]
    resources = [
        {
            "metadata": {"annotations": {ANN_FENCE: "memory errors in the burn-in"}},
            "status": {"deviceUUID": devices[1].uuid.upper()},
        }
    ]
    (got,) = FenceSource(lambda: resources, lambda: devices).reports()
    assert (got.device, got.reason, got.message) == (
        devices[1].name,
        Reason.QUARANTINED,
        "memory errors in the burn-in",
    )
    assert not got.fatal


def test_each_prepare_and_unprepare_tells_the_listeners(short_tmp: Path) -> None:
    preparer = empty_preparer(short_tmp)
    told: list[None] = []
    preparer.listeners.append(lambda: told.append(None))
    preparer.prepare([])
    preparer.unprepare([])
    assert len(told) == 2
