"""The matmul workload a pod runs, against a real donor: its JSON line and exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from composable_dra.model.remote_env import ENDPOINT, TOKEN, endpoint_file
from composable_dra.model.remote_env import lease_env as names_for
from remote_gpu import tokens
from remote_gpu.donor import DonorConfig
from remote_gpu.workloads import matmul
from tests.unit.remote_gpu.conftest import SECRET, Running, start_donor, stop_donor


@pytest.fixture(scope="module")
def donor() -> Iterator[Running]:
    allow = {"matmul": "remote_gpu.builtins:matmul", "wrong": "remote_gpu.builtins:add"}
    config = DonorConfig(name="donor-m", secret=SECRET, allow=allow, memory_quota=8 << 20)
    running, thread = start_donor(config)
    yield running
    stop_donor(running, thread)


def lease_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, endpoint: str, token: tokens.Token
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(json.dumps(token.to_json()))
    token_file.chmod(0o400)
    monkeypatch.setenv("REMOTE_GPU_ENDPOINT", endpoint)
    monkeypatch.setenv("REMOTE_GPU_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("REMOTE_GPU_LEASE", str(token.lease))
    monkeypatch.setenv("REMOTE_GPU_TRANSPORT", "tcp")


def last_line(capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    out: dict[str, object] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return out


Workload = Callable[..., tuple[int, dict[str, object]]]


@pytest.fixture
def workload(
    donor: Running,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> Workload:
    """Run the workload with a lease of the donor (a token of ``token_of`` when given):
    its exit code and its JSON line."""

    def run(*args: str, token_of: str | None = None) -> tuple[int, dict[str, object]]:
        token = donor.token(donor=token_of)
        lease_env(monkeypatch, tmp_path, donor.endpoint, token)
        code = matmul.main(list(args))
        return code, last_line(capsys)

    return run


def test_products_checked_and_reported(workload: Workload) -> None:
    code, out = workload("--size", "64", "--calls", "3")
    assert code == matmul.OK
    assert out["ok"] is True and out["calls"] == 3 and out["where"] == "remote"
    assert out["bytes"] == 3 * 3 * 64 * 64 * 4  # two operands and the product, each call


def test_a_narrow_right_operand(workload: Workload) -> None:
    code, out = workload("--size", "64", "--cols", "2", "--calls", "3")
    assert code == matmul.OK and out["ok"] is True
    assert out["bytes"] == 3 * (64 * 64 + 64 * 2 + 64 * 2) * 4


def test_a_wrong_product_fails_the_pod(workload: Workload) -> None:
    code, out = workload("--size", "8", "--function", "wrong")
    assert code == matmul.WRONG
    assert out["ok"] is False and out["error"] == "wrong product"


@pytest.mark.parametrize(
    ("function", "token_of", "code"),
    [
        ("not-allowed", None, "not_allowed"),
        ("matmul", "another-donor", "auth_failed"),
    ],
)
def test_typed_errors_are_reported_with_their_code(
    workload: Workload, function: str, token_of: str | None, code: str
) -> None:
    exit_code, out = workload("--size", "8", "--function", function, token_of=token_of)
    assert exit_code == matmul.SERVICE_ERROR
    assert out["ok"] is False and out["code"] == code


def test_a_pod_without_its_lease_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REMOTE_GPU_ENDPOINT", raising=False)
    monkeypatch.delenv("REMOTE_GPU_TOKEN_FILE", raising=False)
    assert matmul.main([]) == matmul.NOT_CONFIGURED
    assert "REMOTE_GPU_ENDPOINT" in str(last_line(capsys)["error"])


def test_local_fallback_computes_here_without_a_lease(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REMOTE_GPU_ENDPOINT", raising=False)
    monkeypatch.setenv("REMOTE_GPU_BACKEND", "numpy")
    assert matmul.main(["--size", "16", "--calls", "2", "--local-fallback"]) == matmul.OK
    out = last_line(capsys)
    assert out["ok"] is True and out["where"] == "local" and out["backend"] == "numpy"
    assert out["calls"] == 2


def lease_dir(directory: Path, endpoint: str, token: tokens.Token) -> Path:
    """A lease's directory, as the plugin writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    tokens.write(directory / TOKEN, token)
    (directory / ENDPOINT).write_bytes(endpoint_file(endpoint, token.lease))
    return directory


def several_leases(
    donor: Running, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, count: int
) -> list[int]:
    """The env a claim for ``count`` remote GPUs gives (the names the plugin writes)."""
    ids = []
    for i in range(count):
        token = donor.token()
        directory = lease_dir(tmp_path / f"lease-{i}", donor.endpoint, token)
        for k, v in names_for(i, count, donor.endpoint, token.lease, str(directory)).items():
            monkeypatch.setenv(k, v)
        ids.append(token.lease)
    monkeypatch.setenv("REMOTE_GPU_TRANSPORT", "tcp")
    return ids


def test_all_leases_spreads_the_products_over_every_lease_and_checks_them(
    donor: Running,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ids = several_leases(donor, monkeypatch, tmp_path, 3)
    code = matmul.main(["--all-leases", "--size", "32", "--calls", "7"])
    out = last_line(capsys)
    assert code == matmul.OK and out["ok"] is True, out
    assert out["leases"] == ids and out["calls"] == 7
    by_lease = out["calls_by_lease"]
    assert isinstance(by_lease, dict) and sorted(by_lease) == sorted(map(str, ids))
    assert all(n >= 1 for n in by_lease.values()) and sum(by_lease.values()) == 7
    assert out["bytes"] == 7 * 3 * 32 * 32 * 4


def test_all_leases_with_a_wrong_product_exits_1(
    donor: Running,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    several_leases(donor, monkeypatch, tmp_path, 2)
    code = matmul.main(["--all-leases", "--size", "16", "--function", "wrong"])
    out = last_line(capsys)
    assert code == matmul.WRONG and out["ok"] is False and "wrong products" in str(out["error"])
