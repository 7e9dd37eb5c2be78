"""The plugin's lending flags: off by default, a clear error for every missing input."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from dra_driver.plugin_main import add_arguments, lend_policy
from dra_driver.slices import NETWORK_DOMAIN_LABEL, LendPolicy


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--node-name=node-a", *argv])


def _node(labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "node-a", "labels": labels or {}}}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "LEND",
        "NETWORK_DOMAIN",
        "LINK_GBPS",
        "MAX_LEASES",
        "LEND_TRANSPORTS",
        "BORROWERS",
        "DONOR_STATUS_INTERVAL",
    ):
        monkeypatch.delenv(name, raising=False)


def test_off_by_default() -> None:
    assert lend_policy(_args(), _node({NETWORK_DOMAIN_LABEL: "rack-1"})) is None


def test_flags_make_a_policy_and_the_node_label_gives_the_domain() -> None:
    args = _args("--lend", "--link-gbps=100", "--max-leases=5", "--lend-transports=tcp,ucx")
    assert lend_policy(args, _node({NETWORK_DOMAIN_LABEL: "rack-1"})) == LendPolicy(
        network_domain="rack-1", link_gbps=100, max_leases=5, transports=("tcp", "ucx")
    )
    flag = _args("--lend", "--link-gbps=100", "--max-leases=5", "--network-domain=rack-2")
    policy = lend_policy(flag, _node({NETWORK_DOMAIN_LABEL: "rack-1"}))
    assert policy is not None and policy.network_domain == "rack-2"


def test_env_turns_lending_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEND", "true")
    monkeypatch.setenv("LINK_GBPS", "25")
    monkeypatch.setenv("MAX_LEASES", "2")
    monkeypatch.setenv("NETWORK_DOMAIN", "rack-1")
    monkeypatch.setenv("BORROWERS", "team=vision")
    policy = lend_policy(_args(), _node())
    assert policy == LendPolicy(
        network_domain="rack-1", link_gbps=25, max_leases=2, borrowers=(("team", "vision"),)
    )


@pytest.mark.parametrize(
    ("argv", "labels", "message"),
    [
        (["--lend", "--link-gbps=100", "--max-leases=5"], {}, "network-domain"),
        (["--lend", "--max-leases=5"], {NETWORK_DOMAIN_LABEL: "r"}, "--link-gbps"),
        (["--lend", "--link-gbps=100"], {NETWORK_DOMAIN_LABEL: "r"}, "--max-leases"),
        (["--lend", "--link-gbps=100", "--max-leases=0"], {NETWORK_DOMAIN_LABEL: "r"}, "leases"),
        (
            ["--lend", "--link-gbps=1", "--max-leases=1", "--lend-transports=shm"],
            {NETWORK_DOMAIN_LABEL: "r"},
            "transports",
        ),
        (
            ["--lend", "--link-gbps=1", "--max-leases=1", "--borrowers=novalue"],
            {NETWORK_DOMAIN_LABEL: "r"},
            "key=value",
        ),
    ],
)
def test_missing_or_bad_input_is_a_clear_error(
    argv: list[str], labels: dict[str, str], message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        lend_policy(_args(*argv), _node(labels))


def test_the_donor_status_poller_needs_a_lease_client_and_sound_thresholds() -> None:
    from types import SimpleNamespace

    from dra_driver.plugin_main import _donor_status

    publisher = SimpleNamespace(set_lend_state=lambda _state: None)
    policy = LendPolicy(network_domain="rack-1", link_gbps=100, max_leases=4)
    args = _args("--lend", "--link-busy-at=0.8", "--link-clear-at=0.3")
    assert _donor_status(args, None, publisher, policy) is None  # no lease token file
    poller = _donor_status(args, object(), publisher, policy)
    assert poller.rule.busy_at == 0.8 and poller.knee == 4 and poller.interval == 5.0
    off = _args("--lend", "--donor-status-interval=0")
    assert _donor_status(off, object(), publisher, policy) is None
    for bad in (("--link-busy-at=0.4", "--link-clear-at=0.5"), ("--link-busy-at=1.5",)):
        with pytest.raises(SystemExit, match="link-busy-at"):
            _donor_status(_args("--lend", *bad), object(), publisher, policy)
