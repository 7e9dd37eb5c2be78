"""What the donor measures for the lending policy, its status endpoint, and SLO admission
when a lease opens (``remote_gpu/lending.py``, ``GET /v1/leases/status``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from composable_dra.lending import qos
from composable_dra.lending.remote_leases import Code, LeaseAPIError, LendingStatus
from remote_gpu import slo
from remote_gpu.client import RemoteGPU
from remote_gpu.donor import DonorConfig
from remote_gpu.donor_main import add_arguments, lending_monitor
from remote_gpu.identity import Identity
from remote_gpu.lending import LendingMonitor
from testbed.wait import wait_for

from .conftest import ALLOW, SECRET, start_donor, stop_donor
from .test_lease_api import (
    DONOR,
    DRIVER,
    IDS,
    PLUGIN,
    Served,
    allocated_claim,
    refused,
    request,
)

PACED = slo.LatencyModel(0.05, 0.05)  # 50 ms a call alone, 100 ms with two leases


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_status_reports_the_link_load_over_its_window() -> None:
    clock = Clock()
    m = LendingMonitor(1000.0, window_s=2.0, clock=clock)
    m.on_report(3000, [("f", 0.01), ("f", 0.012)], leases=1)
    s = m.status("inst", [])
    assert s.link_bytes_per_second == 1500.0 and s.link_load == 1.0  # capped at the link
    assert s.functions["f"].samples == 2
    clock.now += 2.5
    assert m.status("inst", []).link_load == 0.0
    unknown = LendingMonitor(None).status("inst", [])
    assert unknown.link_load is None and unknown.link_capacity is None


def test_refusal_keeps_every_admitted_slo() -> None:
    m = LendingMonitor(priors={"paced": PACED}, functions={"paced", "matmul"})
    tight = slo.Lease("paced", 0.08)
    assert m.refusal([], tight) is None
    assert m.capacity([tight]) == 1  # a second lease would take 100 ms a call
    why = m.refusal([tight], slo.Lease(""))
    assert why is not None and "paced 0.08s" in why
    assert m.refusal([slo.Lease("paced", 1.0)], slo.Lease("")) is None
    # The candidate's own SLO, and a function the donor has no model of.
    assert m.refusal([slo.Lease("")], slo.Lease("paced", 0.06)) is not None
    assert "not on the allow-list" in (m.refusal([], slo.Lease("nope", 1.0)) or "")
    assert "--latency-model" in (m.refusal([], slo.Lease("matmul", 1.0)) or "")
    # Measured at two concurrencies, the fit replaces the prior.
    for k in (1, 2):
        m.on_report(0, [("paced", 0.05 * k)] * 3, leases=k)
    assert m.models()["paced"].latency(3) == pytest.approx(0.15)


def test_donor_flags_build_the_monitor_or_say_what_is_wrong() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    base = ["--name", "d", "--secret-file", "/dev/null"]
    args = parser.parse_args([*base, "--latency-model=paced=0.05", "--status-window=3"])
    m = lending_monitor(args, 1e6, {"paced": "remote_gpu.builtins:paced_matmul"})
    assert m.priors == {"paced": PACED} and m.status("i", []).window_s == 3.0
    for bad in (["--latency-model=paced"], ["--status-window=0"]):
        with pytest.raises(SystemExit, match="remote-gpu-donor"):
            lending_monitor(parser.parse_args([*base, *bad]), None, {})


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    IDS["plugin-a"] = Identity(PLUGIN, DONOR, "plugin-pod-a")  # the donor node's own plugin
    s = Served(tmp_path_factory.mktemp("lease-api-lending"))
    s.api.monitor = LendingMonitor(1e6, priors={"paced": PACED}, functions={"paced"})
    yield s
    s.close()


def slo_claim(uid: str, device: str, latency: Any) -> dict[str, Any]:
    claim = allocated_claim(uid, device=device)
    parameters = {"apiVersion": "gpu.composable.dra.io/v1alpha1", "kind": "GpuConfig"}
    claim["status"]["allocation"]["devices"]["config"] = [
        {
            "source": "FromClaim",
            "requests": ["gpu"],
            "opaque": {"driver": DRIVER, "parameters": {**parameters, "latencySLO": latency}},
        }
    ]
    return claim


def test_only_the_donor_nodes_plugin_and_the_controller_read_the_status(measured: Served) -> None:
    assert measured.client("plugin-a").status(DONOR).link_capacity == 1e6
    assert measured.client("controller").status(DONOR).leases >= 0
    for who in ("plugin-c", "plugin-unbound", "stranger"):
        refused(lambda w=who: measured.client(w).status(DONOR), Code.FORBIDDEN)


def test_a_lease_that_would_break_an_admitted_slo_is_refused_until_it_ends(
    measured: Served,
) -> None:
    controller = measured.client("controller")
    measured.claims.items[("ns", "c1")] = slo_claim(
        "s1", "gpu-0-remote", {"function": "paced", "seconds": 0.08}
    )
    first = controller.open(DONOR, request("s1"))
    assert controller.status(DONOR).lease_capacity == 1
    # Another claim, no SLO of its own: two leases would break the first's 80 ms.
    measured.claims.items[("ns", "c1")] = allocated_claim("s2", device="gpu-1-remote")
    with pytest.raises(Exception) as err:
        controller.open(DONOR, request("s2", device="gpu-1-remote"))
    assert getattr(err.value, "code", None) is Code.SLO_UNMET, err.value
    assert "paced 0.08s" in str(err.value)
    controller.close(DONOR, first.lease)
    assert controller.status(DONOR).lease_capacity > 1
    second = controller.open(DONOR, request("s2", device="gpu-1-remote"))
    controller.close(DONOR, second.lease)
    # An SLO that does not parse is a bad request, with the reason.
    measured.claims.items[("ns", "c1")] = slo_claim("s3", "gpu-0-remote", {"function": "paced"})
    refused(lambda: controller.open(DONOR, request("s3")), Code.BAD_REQUEST)


def test_the_data_plane_feeds_the_monitor(tmp_path: Path) -> None:
    monitor = LendingMonitor(1e9, window_s=60.0)
    running, thread = start_donor(
        DonorConfig(name="donor-m", secret=SECRET, allow=ALLOW, monitor=monitor)
    )
    try:
        gpu = RemoteGPU(running.endpoint, running.token(), transport="tcp", timeout=10)
        try:
            for _ in range(5):
                gpu.invoke("echo", np.arange(1024, dtype=np.float32))
        finally:
            gpu.close()

        # The worker reports every quarter second, and once more as its lease ends.
        def reported() -> LendingStatus | None:
            s = monitor.status("i", [])
            echo = s.functions.get("echo")
            return s if echo is not None and echo.samples == 5 else None

        status = wait_for(reported, 10, "the worker's report of 5 calls")
        assert status.link_bytes_per_second * 60.0 >= 5 * 2 * 4096
    finally:
        stop_donor(running, thread)


def test_the_status_names_the_leased_devices_with_their_claims_qos_profiles(
    measured: Served,
) -> None:
    """The donor node's plugin keeps the headroom of the leases' profiles (issue 18)."""
    controller = measured.client("controller")
    claim = slo_claim("q1", "gpu-0-remote", {"function": "paced", "seconds": 1.0})
    config = claim["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]
    config["qos"] = {"transfer": 0.5, "tolerance": 0.1, "hostLoad": 0.2}
    measured.claims.items[("ns", "c1")] = claim
    lease = controller.open(DONOR, request("q1"))
    leased = measured.client("plugin-a").status(DONOR).leased
    assert [(x.device, x.qos.profile() if x.qos else None) for x in leased] == [
        ("gpu-0-remote", qos.QosProfile(transfer=0.5, tolerance=0.1, host_load=0.2))
    ]
    controller.close(DONOR, lease.lease)
    assert measured.client("plugin-a").status(DONOR).leased == []
    # A profile that does not parse is a bad request, with the reason.
    config["qos"] = {"transfer": 0.5, "tolerance": 0}
    measured.claims.items[("ns", "c1")] = claim
    with pytest.raises(LeaseAPIError, match=r"invalid GpuConfig: qos\.tolerance") as err:
        controller.open(DONOR, request("q1"))
    assert err.value.code is Code.BAD_REQUEST
