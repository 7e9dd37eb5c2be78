"""The NVML health source over the fake NVML (testbed/fake_nvml) and its pure rules: which
XIDs are device faults, ECC, a lost GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composable_dra.model.health import Health, Reason
from dra_driver.device_source import device_name_for
from dra_driver.sources.nvml import NvmlSource
from dra_driver.sources.nvml_health import (
    APPLICATION_XIDS,
    GpuFacts,
    NvmlHealth,
    classify_xid,
    judge,
)
from fabric_emulator import host_bus
from testbed import fake_nvml
from testbed.fake_nvml import pynvml as fake

HOST = "node-1"
UUID = "GPU-11111111-2222-3333-4444-555555555555"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(fake_nvml.ROOT_ENV, str(tmp_path))
    monkeypatch.setenv(fake_nvml.HOST_ENV, HOST)
    host_bus.attach(tmp_path, HOST, "gpu-1", UUID, "H100", 81559)
    yield tmp_path


def _set(root: Path, **changes: object) -> None:
    host_bus.update(root, HOST, UUID, lambda g: replace(g, **changes))  # type: ignore[arg-type]


def one(source: NvmlHealth) -> tuple[Health, Reason | None]:
    [r] = list(source.reports())
    assert r.device == device_name_for(UUID)
    return r.health, r.reason


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_are_not_device_faults(xid: int) -> None:
    assert classify_xid(xid) is None


def test_xid_79_is_a_lost_gpu_and_other_xids_are_faults() -> None:
    assert classify_xid(79) is Reason.GPU_LOST
    assert classify_xid(48) is Reason.XID_ERROR
    assert classify_xid(95) is Reason.XID_ERROR


@given(st.integers(0, 200), st.integers(0, 3), st.booleans())
def test_the_worst_sign_wins(xid: int, ecc: int, lost: bool) -> None:
    r = judge(GpuFacts(UUID, lost=lost, ecc_uncorrected=ecc, xids=(xid,)))
    if lost or xid == 79:
        assert (r.reason, r.fatal) == (Reason.GPU_LOST, True)
    elif ecc:
        assert r.reason is Reason.ECC_ERROR
    elif xid in APPLICATION_XIDS:
        assert r.health is Health.HEALTHY
    else:
        assert r.reason is Reason.XID_ERROR


def test_a_healthy_gpu(host: Path) -> None:
    assert one(NvmlHealth(fake)) == (Health.HEALTHY, None)


def test_an_xid_event_makes_it_unhealthy_and_it_stays(host: Path) -> None:
    source = NvmlHealth(fake)
    one(source)  # registers the GPU for XID events
    _set(host, xids=(48,))
    assert one(source) == (Health.UNHEALTHY, Reason.XID_ERROR)
    assert one(source) == (Health.UNHEALTHY, Reason.XID_ERROR)  # delivered once, kept


def test_an_application_xid_leaves_it_healthy(host: Path) -> None:
    source = NvmlHealth(fake)
    one(source)
    _set(host, xids=(13, 43))
    assert one(source) == (Health.HEALTHY, None)


def test_double_bit_ecc_is_unhealthy(host: Path) -> None:
    _set(host, ecc_uncorrected_volatile=2)
    assert one(NvmlHealth(fake)) == (Health.UNHEALTHY, Reason.ECC_ERROR)


def test_a_lost_gpu_is_reported_lost(host: Path) -> None:
    source = NvmlHealth(fake)
    one(source)
    _set(host, lost=True)
    assert one(source) == (Health.UNHEALTHY, Reason.GPU_LOST)


def test_a_gpu_that_left_takes_its_xids_with_it(host: Path) -> None:
    source = NvmlHealth(fake)
    one(source)
    _set(host, xids=(48,))
    one(source)
    host_bus.release(host, HOST, UUID)
    assert list(source.reports()) == []
    source.close()


def test_the_device_source_reads_the_fake_and_its_process_table(host: Path) -> None:
    src = NvmlSource(nvml=fake)
    [d] = src.list_devices()
    assert (d.uuid, d.model, d.memory_bytes) == (UUID, "H100", 81559 * 1024 * 1024)
    assert src.processes(UUID) == []
    host_bus.set_processes(host, HOST, UUID, (7, 3))
    assert src.processes(UUID) == [3, 7]
    host_bus.release(host, HOST, UUID)
    assert src.list_devices() == []  # a released GPU is gone from the host
    src.close()


def test_the_fake_is_what_a_plugin_with_its_environment_imports(tmp_path: Path) -> None:
    env = {**os.environ, **fake_nvml.env(tmp_path, HOST)}
    out = subprocess.run(
        [sys.executable, "-c", "import pynvml; print(pynvml.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == fake.__file__


def test_the_device_source_is_a_health_source_too(host: Path) -> None:
    # The plugin's health board takes a device source with ``reports`` as a source.
    src = NvmlSource(nvml=fake)
    _set(host, ecc_uncorrected_volatile=1)
    [r] = list(src.reports())
    assert (r.device, r.reason, r.source) == (device_name_for(UUID), Reason.ECC_ERROR, "nvml")
    src.close()
