from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from remote_gpu import tokens
from remote_gpu.client import RemoteGPU
from remote_gpu.donor import DonorConfig
from remote_gpu.errors import (
    AdmissionRefused,
    AuthError,
    FlowControlError,
    FunctionFailed,
    LeaseBusy,
    MemoryQuotaExceeded,
    NotAllowed,
    RateLimited,
    RemoteGPUError,
    VersionError,
)
from remote_gpu.protocol import HEADER_SIZE, HELLO_KEY, Header, Op, unpack
from testbed.wait import wait_for

from .conftest import ALLOW, SECRET, Running, start_donor, stop_donor


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("served", ["direct", "relayed"])
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_invoke_round_trips_arrays(
    request: pytest.FixtureRequest, served: str, transport: str
) -> None:
    donor: Running = request.getfixturevalue("donor" if served == "direct" else "relayed")
    before = _sample("remote_gpu_bytes_total", side="donor", direction="in", transport=transport)
    with RemoteGPU(donor.endpoint, donor.token(), transport=transport) as gpu:
        assert gpu.transport == transport
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        b = np.ones((3, 4), dtype=np.float32)
        (out,) = gpu.invoke("add", a, b)
        np.testing.assert_array_equal(out, a + b)
        x, y = gpu.invoke("echo", np.arange(5, dtype=np.int64), np.array(True))
        np.testing.assert_array_equal(x, np.arange(5))
        assert y.dtype == np.bool_ and y.shape == ()
        futures = [gpu.submit("echo", np.full(1000, i, dtype=np.uint16)) for i in range(20)]
        for i, f in enumerate(futures):
            assert (f.result(10)[0] == i).all()
        assert gpu.heartbeat() < 5
    # The worker serving the connection reports its counters to the donor as it goes and
    # when the lease ends, which is after the client has returned from close().
    wait_for(
        lambda: (
            _sample("remote_gpu_bytes_total", side="donor", direction="in", transport=transport)
            - before
            >= 2 * 48 + 20 * 2000
        ),
        10,
        "the donor to count the bytes",
    )


def test_auto_picks_shared_memory_on_the_same_host(donor: Running) -> None:
    with RemoteGPU(donor.endpoint, donor.token()) as gpu:
        assert gpu.transport == "shm"


def test_function_errors_are_typed_and_the_lease_survives(donor: Running) -> None:
    with RemoteGPU(donor.endpoint, donor.token(), transport="tcp") as gpu:
        with pytest.raises(FunctionFailed, match="ValueError"):
            gpu.invoke("fail", np.zeros(3))
        with pytest.raises(NotAllowed):
            gpu.invoke("os:system", np.zeros(3))
        (out,) = gpu.invoke("echo", np.arange(3))
        assert list(out) == [0, 1, 2]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_memory_quota(donor: Running, transport: str) -> None:
    with RemoteGPU(donor.endpoint, donor.token(), transport=transport) as gpu:
        with pytest.raises(MemoryQuotaExceeded):
            gpu.submit("echo", np.zeros(gpu.slot_size + 1, dtype=np.uint8))
        with pytest.raises(MemoryQuotaExceeded):
            gpu.invoke("big", np.array([gpu.slot_size], dtype=np.int64))
        (out,) = gpu.invoke("big", np.array([1000], dtype=np.int64))
        assert out.shape == (1000,)


def test_bad_expired_and_foreign_tokens_are_refused(donor: Running) -> None:
    good = donor.token()
    forged = dataclasses.replace(good, mac="00" * 32)
    expired = tokens.issue(SECRET, 77, donor.donor.config.name, -1)
    foreign = donor.token(donor="donor-b")
    for bad in (forged, expired, foreign):
        with pytest.raises(AuthError):
            RemoteGPU(donor.endpoint, bad)
    refusals = _sample("remote_gpu_errors_total", side="donor", code="auth_failed")
    assert refusals >= 3
    with RemoteGPU(donor.endpoint, good) as gpu:
        assert gpu.invoke("echo", np.arange(2))[0].tolist() == [0, 1]


def test_one_connection_per_lease(donor: Running) -> None:
    tok = donor.token()
    with RemoteGPU(donor.endpoint, tok), pytest.raises(LeaseBusy):
        RemoteGPU(donor.endpoint, tok)


def test_version_negotiation(donor: Running) -> None:
    with pytest.raises(VersionError):
        RemoteGPU(donor.endpoint, donor.token(), versions=(99,))
    with RemoteGPU(donor.endpoint, donor.token(), versions=(1, 2, 7)) as gpu:
        assert gpu.version == 2


def test_from_env(donor: Running, tmp_path: Path) -> None:
    tok = donor.token()
    path = tmp_path / "token"
    tokens.write(path, tok)
    env = {
        "REMOTE_GPU_ENDPOINT": donor.endpoint,
        "REMOTE_GPU_TOKEN_FILE": str(path),
        "REMOTE_GPU_LEASE": str(tok.lease),
        "REMOTE_GPU_TRANSPORT": "tcp",
    }
    with RemoteGPU.from_env(env) as gpu:
        assert gpu.transport == "tcp" and gpu.lease == tok.lease
        assert gpu.invoke("echo", np.arange(3))[0].sum() == 3
    with pytest.raises(RemoteGPUError, match="does not match"):
        RemoteGPU.from_env({**env, "REMOTE_GPU_LEASE": "1"})


def test_exceeding_credits_is_a_flow_control_error(relayed: Running) -> None:
    donor = relayed
    with RemoteGPU(donor.endpoint, donor.token(), transport="tcp", credits=2) as gpu:
        assert gpu.credits == 2
        frames = []
        for seq in range(100, 103):  # one more than the credits, bypassing the client's check
            frames += gpu._invoke_frames(seq, None, "echo", [np.arange(4)])
        gpu._tr.send_frames(frames)
        with pytest.raises(FlowControlError):
            gpu.heartbeat()  # reading replies surfaces the refusal
    with RemoteGPU(donor.endpoint, donor.token()) as other:
        assert other.invoke("echo", np.arange(1))[0].tolist() == [0]


def _raw_hello_reply(donor: Running, data: bytes) -> Header | None:
    """The donor's answer to ``data`` sent as the HELLO (after its CHALLENGE)."""
    with socket.create_connection((donor.host, donor.port), timeout=10) as s:
        challenge = _read_frame(s)
        assert challenge is not None and challenge.op == Op.CHALLENGE
        s.sendall(data)
        # The donor may have answered and closed already (it reads no further than a bad
        # header, so the rest resets the connection): its answer is still to be read.
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_WR)
        return _read_frame(s)


def _read_frame(s: socket.socket) -> Header | None:
    """One frame's header (its metadata skipped), or None if the connection ended."""
    buf = b""
    while len(buf) < HEADER_SIZE:
        chunk = s.recv(HEADER_SIZE - len(buf))
        if not chunk:
            return None
        buf += chunk
    header = unpack(buf, HELLO_KEY, 1 << 16)
    left = header.length
    while left:
        chunk = s.recv(left)
        if not chunk:
            return None
        left -= len(chunk)
    return header


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(min_size=1, max_size=300))
def test_malformed_input_gets_an_error_and_others_are_served(donor: Running, data: bytes) -> None:
    reply = _raw_hello_reply(donor, data)
    assert reply is None or reply.op == Op.ERROR


def test_garbage_after_hello_kills_only_that_connection(donor: Running) -> None:
    with (
        RemoteGPU(donor.endpoint, donor.token(), transport="tcp") as victim,
        RemoteGPU(donor.endpoint, donor.token(), transport="tcp") as bystander,
    ):
        victim._tr.send_frames([(os.urandom(HEADER_SIZE), None)])
        with pytest.raises(RemoteGPUError) as refused:
            victim.heartbeat()
        assert refused.value.code.value in ("bad_frame", "internal")
        with pytest.raises(RemoteGPUError):
            victim.invoke("echo", np.arange(1))
        assert bystander.invoke("echo", np.arange(3))[0].tolist() == [0, 1, 2]
    assert _raw_hello_reply(donor, b"RGPU" + bytes(200)) is not None


def test_rate_quota() -> None:
    config = DonorConfig(name="rated", secret=SECRET, allow=ALLOW, rate_limit=1.0, rate_burst=2)
    running, thread = start_donor(config)
    try:
        with RemoteGPU(running.endpoint, running.token(), transport="tcp") as gpu:
            gpu.invoke("echo", np.arange(1))
            gpu.invoke("echo", np.arange(1))
            with pytest.raises(RateLimited):
                gpu.invoke("echo", np.arange(1))
    finally:
        stop_donor(running, thread)


def test_admission_control_refuses_a_lease_that_would_saturate_the_link() -> None:
    config = DonorConfig(name="narrow", secret=SECRET, allow=ALLOW, link_bandwidth=100e6)
    running, thread = start_donor(config)
    try:
        load = {"frame_bytes": 30_000_000, "target_rate": 1.0}
        first = [RemoteGPU(running.endpoint, running.token(), **load) for _ in range(3)]  # type: ignore[arg-type]
        with pytest.raises(AdmissionRefused):
            RemoteGPU(running.endpoint, running.token(), **load)  # type: ignore[arg-type]
        first[0].close()
        wait_for(lambda: len(running.donor.leases) == 2, 10, "the lease to be released")
        with RemoteGPU(running.endpoint, running.token(), **load) as again:  # type: ignore[arg-type]
            assert again.invoke("echo", np.arange(1))[0].tolist() == [0]
        for gpu in first[1:]:
            gpu.close()
    finally:
        stop_donor(running, thread)
