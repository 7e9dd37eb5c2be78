"""The donor health source: a lent GPU's RemoteGPUFailed (the lease controller's word) as
its consumer's health (DonorUnreachable, DonorWorkerCrashed), in the kubelet stream."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from composable_dra.model.health import Health, Reason, remote_key
from dra_driver import health_stream
from dra_driver.checkpoint import ClaimRecord, PreparedDevice, RemoteLeaseRecord
from dra_driver.donor_health import DonorHealthSource, device_report
from dra_driver.health_sources import HealthBoard
from dra_driver.prepare import ClaimNotFound
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE
from tests.unit.fuzz_json import JSON_VALUES

DONOR, DEVICE, UID = "node-b", "gpu-0-remote", "11111111-2222-3333-4444-555555555555"


def claim(*conditions: tuple[str, str, str], uid: str = UID) -> dict[str, Any]:
    entry = {
        "driver": DRIVER,
        "pool": DONOR,
        "device": DEVICE,
        "conditions": [
            {"type": t, "status": "True", "reason": r, "message": m} for t, r, m in conditions
        ],
    }
    return {"metadata": {"uid": uid}, "status": {"devices": [entry]}}


def record(remote: bool = True, name: str = "lent") -> ClaimRecord:
    lease = RemoteLeaseRecord(donor=DONOR, lease=3, endpoint="10.0.0.1:7000") if remote else None
    device = PreparedDevice(
        request_names=["gpu"],
        pool_name=DONOR if remote else NODE,
        device_name=DEVICE if remote else "gpu-1",
        local_name=DEVICE if remote else "gpu-1",
        uuid="u",
        cdi_device_ids=[],
        remote=lease,
    )
    return ClaimRecord(uid=UID, namespace="ns", name=name, state="prepared", devices=[device])


def test_the_lease_controller_s_failures_read_as_donor_health() -> None:
    ready = device_report(claim(("RemoteGPUReady", "LeaseOpen", "lease 3")), DRIVER, DONOR, DEVICE)
    assert (ready.device, ready.health) == (remote_key(DONOR, DEVICE), Health.HEALTHY)
    lost = device_report(
        claim(("RemoteGPUFailed", "LeaseLost", "donor node-b no longer holds lease 3")),
        DRIVER,
        DONOR,
        DEVICE,
    )
    assert (lost.health, lost.reason, lost.source) == (
        Health.UNHEALTHY,
        Reason.DONOR_WORKER_CRASHED,
        "donor",
    )
    assert "no longer holds lease 3" in lost.message
    gone = device_report(claim(("RemoteGPUFailed", "DonorUnreachable", "x")), DRIVER, DONOR, DEVICE)
    assert gone.reason is Reason.DONOR_UNREACHABLE
    other = device_report(
        claim(("RemoteGPUFailed", "DonorUnreachable", "x")), "other", DONOR, DEVICE
    )
    assert other.health is Health.HEALTHY  # another driver's entry says nothing of ours


@given(JSON_VALUES)
def test_any_claim_json_is_read_without_error(value: Any) -> None:
    for body in (value, {"status": {"devices": value}}, {"status": {"devices": [value]}}):
        if isinstance(body, dict):
            assert device_report(body, DRIVER, DONOR, DEVICE).device == remote_key(DONOR, DEVICE)


def test_the_source_reads_only_claims_with_remote_devices_and_skips_gone_ones() -> None:
    reads: list[str] = []
    answers = {"lent": claim(("RemoteGPUFailed", "LeaseLost", "gone")), "renamed": claim(uid="x")}

    def read(namespace: str, name: str) -> dict[str, Any]:
        reads.append(name)
        if name not in answers:
            raise ClaimNotFound(name)
        return answers[name]

    records = [record(), record(remote=False, name="local"), record(name="renamed")]
    records.append(record(name="deleted"))
    source = DonorHealthSource(DRIVER, lambda: records, read)
    [report] = source.reports()
    assert (report.device, report.reason) == (
        remote_key(DONOR, DEVICE),
        Reason.DONOR_WORKER_CRASHED,
    )
    assert reads == ["lent", "renamed", "deleted"]


def test_the_kubelet_stream_shows_the_remote_device_s_health_under_its_donor_pool() -> None:
    answer = claim(("RemoteGPUFailed", "DonorUnreachable", "donor node-b: not reached"))
    source = DonorHealthSource(DRIVER, lambda: [record()], lambda _ns, _n: answer)
    board = HealthBoard([source], lambda: ["gpu-1"])
    board.poll_once()
    prepared = record().devices
    got = health_stream.entries(NODE, ["gpu-1"], board.states(), prepared)
    assert [(e.pool, e.device, e.report.health) for e in got] == [
        (NODE, "gpu-1", Health.HEALTHY),
        (DONOR, DEVICE, Health.UNHEALTHY),
    ]
    assert got[1].report.reason is Reason.DONOR_UNREACHABLE
    # Without a donor source nothing is claimed for a remote device (as before).
    assert [e.device for e in health_stream.entries(NODE, [], {}, prepared)] == []
