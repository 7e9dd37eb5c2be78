"""The plugin's QoS attributes (issue 18): what the donor status and NVML give, as the
slices publish them, and the flags that turn them on."""

from __future__ import annotations

import argparse
import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from composable_dra.lending import netaware, qos
from composable_dra.lending.remote_leases import Code, LeaseAPIError, LeasedDevice, LendingStatus
from composable_dra.model.gpu_config import QosConfig
from composable_dra.model.names import normalize_uuid
from dra_driver.lend_status import DonorStatusPoller, QosSampling, qos_attributes
from dra_driver.plugin_main import _donor_status, add_arguments
from dra_driver.slices import LendPolicy, LendState, desired_slices, plan_slices
from dra_driver.sources.nvml import NvmlSource
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, gpu
from tests.unit.dra_driver.test_lending_wiring import Client
from tests.unit.dra_driver.test_plugin_sources import FakeNvml

UID = "node-uid"
POLICY = LendPolicy(network_domain="rack-1", link_gbps=100, max_leases=3)
RULE = netaware.LinkBusyRule(busy_at=0.7, clear_at=0.5)
HOST = qos.HostProfile(slowdown_at_full=0.4)
# The host carries 10 kB/s; the link 1 kB/s (the status below).
SAMPLING = QosSampling(host=HOST, host_bandwidth=10_000.0)


def status(link_bytes: float, link_capacity: float | None = 1000.0) -> LendingStatus:
    return LendingStatus(
        instance="i",
        leases=1,
        window_s=10.0,
        link_bytes_per_second=link_bytes,
        link_capacity=link_capacity,
        link_load=None if link_capacity is None else min(1.0, link_bytes / link_capacity),
        lease_capacity=1024,
    )


def test_host_load_is_the_lease_traffic_and_the_gpus_pcie_over_the_host_bandwidth() -> None:
    # 900 B/s of leases (link 90% busy) and 1,100 B/s on the GPUs' PCIe: 20% of the host.
    a = qos_attributes(status(900.0), 1100.0, (), SAMPLING)
    assert dict(a.local) == {qos.HOST_SLOWDOWN: 100, qos.HEADROOM: 1000}  # 0.4 * 0.2, a step up
    assert dict(a.remote) == {**dict(a.local), qos.LINK_LOAD: 900}
    # Without NVML (None) only the lease traffic counts; a donor with no link bandwidth
    # gives no linkLoad, so the claims' selectors treat the device by its host alone.
    assert dict(qos_attributes(status(900.0), None, (), SAMPLING).local)[qos.HOST_SLOWDOWN] == 50
    unknown = qos_attributes(status(900.0, None), None, (), SAMPLING).remote
    assert qos.LINK_LOAD not in dict(unknown)


def test_the_headroom_keeps_the_profiles_of_claims_held_here_and_of_the_donors_leases() -> None:
    # A claim prepared here on gpu-0 with a profile lowers the headroom (qos.headroom).
    held = [("gpu-0", qos.QosProfile(transfer=0.0, tolerance=0.1, host_load=0.1)), ("gpu-2", None)]
    a = qos_attributes(status(900.0), 1100.0, held, SAMPLING)
    assert dict(a.local)[qos.HEADROOM] == 150  # 0.1 / 0.4 - (0.2 - 0.1)
    assert a.held == ("gpu-0", "gpu-2")
    # The closed devices publish that headroom taken: no room, and its slowdown added.
    assert dict(a.closed_local) == {qos.HOST_SLOWDOWN: 150, qos.HEADROOM: 0}  # 0.08 + 0.4 * 0.15
    assert dict(a.closed_remote) == {**dict(a.closed_local), qos.LINK_LOAD: 900}
    # A lease the donor holds for a claim with a tighter profile lowers it further; its
    # remote device counts as held.
    lease = LeasedDevice(
        device="gpu-1-remote", qos=QosConfig(transfer=0.5, tolerance=0.05, host_load=0.1)
    )
    leased = status(900.0).model_copy(update={"leased": [lease]})
    a = qos_attributes(leased, 1100.0, held, SAMPLING)
    assert dict(a.local)[qos.HEADROOM] == 75  # 0.05 * 1.5 / 0.4 - (0.2 - 0.1) = 0.0875
    assert a.held == ("gpu-0", "gpu-1-remote", "gpu-2")
    # A lease with no profile holds its device and keeps no headroom.
    bare = status(900.0).model_copy(update={"leased": [LeasedDevice(device="gpu-1-remote")]})
    a = qos_attributes(bare, 1100.0, (), SAMPLING)
    assert dict(a.local)[qos.HEADROOM] == 1000 and a.held == ("gpu-1-remote",)


def test_the_bandwidth_must_be_a_positive_number() -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(qos.ProfileError, match="host bandwidth"):
            QosSampling(host=HOST, host_bandwidth=bad)


def test_the_poller_publishes_the_attributes_only_when_one_moves_a_step() -> None:
    client = Client(
        status(90.0),
        status(95.0),  # still inside the same 25-per-mille steps
        LeaseAPIError(Code.UNAVAILABLE, "down"),  # no answer: nothing changes
        status(800.0),
    )
    published: list[LendState] = []
    poller = DonorStatusPoller(
        client,  # type: ignore[arg-type]
        NODE,
        published.append,
        RULE,
        1.0,
        knee=3,
        sampling=SAMPLING,
    )
    for _ in range(4):
        poller.poll_once()
    assert [dict(s.qos.remote)[qos.LINK_LOAD] for s in published] == [100, 800]
    assert [dict(s.qos.local)[qos.HOST_SLOWDOWN] for s in published] == [25, 50]
    assert published[1].busy  # the taint's rule is applied as before


def test_without_a_host_profile_nothing_is_published_as_before() -> None:
    published: list[LendState] = []
    poller = DonorStatusPoller(Client(status(900.0)), NODE, published.append, RULE, 1.0, knee=3)  # type: ignore[arg-type]
    poller.poll_once()
    assert published == [LendState(busy=True)]


def test_a_pcie_reader_that_fails_leaves_the_lease_traffic() -> None:
    def broken() -> float:
        raise RuntimeError("driver gone")

    sampling = QosSampling(host=HOST, host_bandwidth=10_000.0, pcie=broken)
    published: list[LendState] = []
    poller = DonorStatusPoller(
        Client(status(1000.0)),  # type: ignore[arg-type]
        NODE,
        published.append,
        RULE,
        1.0,
        knee=3,
        sampling=sampling,
    )
    poller.poll_once()
    assert dict(published[0].qos.local)[qos.HOST_SLOWDOWN] == 50  # 0.4 * 0.1, a step up


def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def test_the_slices_carry_the_attributes_on_local_and_remote_devices() -> None:
    attrs = qos_attributes(status(900.0), 1100.0, (), SAMPLING)
    state = LendState(busy=True, qos=attrs)
    # gpu-1 is fabric-attached (kept): published plain, not lent, still on this host.
    fabric = gpu(1)
    slices = desired_slices(
        NODE,
        UID,
        DRIVER,
        [gpu(0), fabric],
        1,
        lend=POLICY,
        keep={normalize_uuid(fabric.uuid)},
        state=state,
    )
    found = devices(slices)
    assert set(found) == {"gpu-0", "gpu-0-remote", "gpu-1"}
    # gpu-0, the first GPU no one holds, carries the headroom; gpu-1 publishes it taken.
    for name in ("gpu-0", "gpu-0-remote"):
        a = found[name]["attributes"]
        assert a[qos.HOST_SLOWDOWN] == {"int": 100} and a[qos.HEADROOM] == {"int": 1000}
    assert found["gpu-1"]["attributes"][qos.HEADROOM] == {"int": 0}
    assert found["gpu-1"]["attributes"][qos.HOST_SLOWDOWN] == {"int": 400}
    for name, d in found.items():
        assert (qos.LINK_LOAD in d["attributes"]) == name.endswith("-remote"), name
    assert found["gpu-0-remote"]["attributes"][qos.LINK_LOAD] == {"int": 900}
    assert [t["key"] for t in found["gpu-0-remote"]["taints"]] == [netaware.LINK_BUSY_TAINT]
    # A step's move is a change to publish; the same values are not.
    moved = LendState(
        busy=True,
        qos=dataclasses.replace(attrs, remote=((qos.LINK_LOAD, 925), *attrs.remote[1:])),
    )
    assert plan_slices(
        NODE, UID, DRIVER, [gpu(0), fabric], slices, 1, POLICY, {normalize_uuid(fabric.uuid)}, state
    ).empty
    assert not plan_slices(
        NODE, UID, DRIVER, [gpu(0), fabric], slices, 1, POLICY, {normalize_uuid(fabric.uuid)}, moved
    ).empty
    plain = devices(desired_slices(NODE, UID, DRIVER, [gpu(0)], 1, lend=POLICY))
    assert not any(qos.HOST_SLOWDOWN in d["attributes"] for d in plain.values())


def test_one_gpu_no_one_holds_carries_the_headroom() -> None:
    """A claim prepared on gpu-0 and a lease of gpu-1's remote device: gpu-2 is open; the
    rest publish no headroom, so no second claim that adds load lands before the next
    publication (the simulator's --one-open)."""
    held = [("gpu-0", None)]
    lease = LeasedDevice(device="gpu-1-remote")
    leased = status(900.0).model_copy(update={"leased": [lease]})
    state = LendState(qos=qos_attributes(leased, 1100.0, held, SAMPLING))
    found = devices(
        desired_slices(NODE, UID, DRIVER, [gpu(i) for i in range(4)], 1, lend=POLICY, state=state)
    )
    room = {n: d["attributes"][qos.HEADROOM]["int"] for n, d in found.items()}
    assert room == {
        "gpu-0": 0, "gpu-0-remote": 0, "gpu-1": 0, "gpu-1-remote": 0,
        "gpu-2": 1000, "gpu-2-remote": 1000, "gpu-3": 0, "gpu-3-remote": 0,
    }  # fmt: skip
    # Everything held: no device offers headroom.
    full = [(f"gpu-{i}", None) for i in range(4)]
    state = LendState(qos=qos_attributes(status(900.0), 1100.0, full, SAMPLING))
    found = devices(
        desired_slices(NODE, UID, DRIVER, [gpu(i) for i in range(4)], 1, lend=POLICY, state=state)
    )
    assert {d["attributes"][qos.HEADROOM]["int"] for d in found.values()} == {0}


class PcieNvml(FakeNvml):
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(self) -> None:
        super().__init__()
        # per GPU index: TX, RX in KB/s; None: the driver cannot say
        self.kbps: dict[int, list[int]] | None = {0: [100, 300], 1: [50, 50]}

    def nvmlDeviceGetPcieThroughput(self, h: dict[str, Any], counter: int) -> int:
        if self.kbps is None:
            raise self.NVMLError("not supported")
        return self.kbps[self.gpus.index(h)][counter]


def test_nvml_pcie_throughput_is_every_gpu_both_ways() -> None:
    fake = PcieNvml()
    src = NvmlSource(nvml=fake)
    assert src.pcie_bytes_per_second() == 500 * 1024
    fake.kbps = None
    assert src.pcie_bytes_per_second() is None  # a GPU that cannot say: unmeasured
    assert fake.inits == 1


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--node-name=node-a", "--lend", *argv])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HOST_SLOWDOWN_AT_FULL", "HOST_BANDWIDTH", "DONOR_STATUS_INTERVAL"):
        monkeypatch.delenv(name, raising=False)


def test_the_flags_turn_it_on_with_a_clear_error_for_bad_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publisher = SimpleNamespace(set_lend_state=lambda _state: None)
    source = NvmlSource(nvml=PcieNvml())
    assert _donor_status(_args(), object(), publisher, POLICY, source).sampling is None
    on = _args("--host-slowdown-at-full=0.2", "--host-bandwidth=1e9")
    sampling = _donor_status(on, object(), publisher, POLICY, source).sampling
    assert sampling.host == qos.HostProfile(0.2) and sampling.host_bandwidth == 1e9
    assert sampling.pcie() == 500 * 1024  # the NVML source's reader
    static = _donor_status(on, object(), publisher, POLICY, object()).sampling
    assert static.pcie is None  # a source that cannot measure PCIe: lease traffic alone
    for bad, message in (
        (("--host-slowdown-at-full=0.2",), "needs --host-bandwidth"),
        (("--host-slowdown-at-full=0", "--host-bandwidth=1e9"), "slowdown_at_full"),
        (("--host-slowdown-at-full=nan", "--host-bandwidth=1e9"), "slowdown_at_full"),
        (("--host-slowdown-at-full=0.2", "--host-bandwidth=-5"), "host bandwidth"),
    ):
        with pytest.raises(SystemExit, match=message):
            _donor_status(_args(*bad), object(), publisher, POLICY, source)
    monkeypatch.setenv("HOST_SLOWDOWN_AT_FULL", "0.3")
    monkeypatch.setenv("HOST_BANDWIDTH", "2e9")
    sampling = _donor_status(_args(), object(), publisher, POLICY, source).sampling
    assert sampling.host == qos.HostProfile(0.3) and sampling.host_bandwidth == 2e9
