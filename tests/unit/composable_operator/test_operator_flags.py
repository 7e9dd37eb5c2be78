"""The operator's flags: the safe detach is on unless turned off (issue 29)."""

from __future__ import annotations

import argparse

import pytest

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
