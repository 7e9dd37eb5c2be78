"""The operator's flags: the safe detach is on unless turned off (issue 29); the flags
every leader-elected controller has, from the one place that defines them."""

from __future__ import annotations

import argparse

import pytest

from composable_dra.process.component import add_common_arguments
from composable_operator.main import add_arguments


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_awaits_the_host_release_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWAIT_HOST_RELEASE", raising=False)
    assert parse().await_host_release is True


def test_older_plugins_turn_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWAIT_HOST_RELEASE", raising=False)
    assert parse("--no-await-host-release").await_host_release is False
    monkeypatch.setenv("AWAIT_HOST_RELEASE", "false")
    assert parse().await_host_release is False
    assert parse("--await-host-release").await_host_release is True


def test_the_operator_has_the_controllers_common_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KUBECONFIG", "DRIVER_NAME", "POD_NAMESPACE", "METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    common = argparse.ArgumentParser()
    add_common_arguments(common, lease="composable-operator", metrics_port=8080)
    defaults = vars(common.parse_args([]))
    assert defaults.items() <= vars(parse()).items()
    assert parse().metrics_port == 8080  # the operator's own port, as before
    timed = parse("--leader-elect-lease-duration=30", "--leader-elect-retry-period=4")
    assert (timed.leader_elect_lease_duration, timed.leader_elect_retry_period) == (30, 4)
    monkeypatch.setenv("METRICS_PORT", "9100")
    assert parse().metrics_port == 9100
