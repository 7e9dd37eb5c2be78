"""Which end-to-end tests run on which release (testbed/versions.py)."""

from __future__ import annotations

import pytest

from testbed import versions
from testbed.controlplane import RELEASES


def test_the_default_release_is_the_pinned_one_and_newer_than_the_older_ones() -> None:
    default = versions.default_release()
    assert default == "v1.37.1"
    assert all(tuple(map(int, versions.minor(r).split("."))) < (1, 37) for r in RELEASES.values())


def test_minor() -> None:
    assert versions.minor("v1.35.8") == "1.35"
    assert versions.minor("1.36") == "1.36"
    for bad in ("", "v2.1.0", "1.35.x", "latest"):
        with pytest.raises(ValueError):
            versions.minor(bad)


def test_run_release_follows_kube_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBE_VERSION", raising=False)
    assert versions.run_release() == versions.default_release()
    monkeypatch.setenv("KUBE_VERSION", "v1.35.8")
    assert versions.run_release() == "v1.35.8"


@pytest.mark.parametrize(
    ("marked", "on_default", "release", "runs"),
    [
        (None, True, "v1.37.1", True),  # every test on the default release
        (None, True, "v1.35.8", False),  # an older release runs its subset only
        (("1.35", "1.36"), True, "v1.35.8", True),
        (("1.35", "1.36"), True, "v1.36.5", True),
        (("1.35", "1.36"), True, "v1.37.1", True),
        (("1.36",), True, "v1.35.8", False),
        (("1.35",), False, "v1.37.1", False),  # default=False: the older one only
        (("1.35",), False, "v1.35.8", True),
    ],
)
def test_runs_on(
    marked: tuple[str, ...] | None, on_default: bool, release: str, runs: bool
) -> None:
    assert versions.runs_on(marked, on_default, release) is runs


@pytest.mark.parametrize(
    ("marked", "gated", "release", "runs"),
    [
        (("1.36",), ("1.35",), "v1.35.8+gates", True),
        (("1.36",), ("1.35",), "v1.35.8", False),  # without its gates: not in 1.35's run
        (("1.36",), ("1.35",), "v1.36.5", True),
        (("1.36",), ("1.35",), "v1.37.1", True),
        (("1.35", "1.36"), (), "v1.35.8+gates", False),  # a gated run: only gated= tests
        (None, (), "v1.35.8+gates", False),
    ],
)
def test_a_gated_run_runs_the_tests_marked_for_it_only(
    marked: tuple[str, ...] | None, gated: tuple[str, ...], release: str, runs: bool
) -> None:
    assert versions.runs_on(marked, True, release, gated) is runs


def test_a_gated_run_turns_on_its_releases_gates_and_is_labelled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBE_VERSION", "v1.35.8")
    monkeypatch.delenv("KUBE_GATES", raising=False)
    assert (versions.run_label(), versions.run_gates()) == ("v1.35.8", {})
    monkeypatch.setenv("KUBE_GATES", "on")
    assert versions.run_label() == "v1.35.8+gates"
    assert versions.run_gates() == {
        "DRADeviceBindingConditions": True,
        "DRAPartitionableDevices": True,
    }
    monkeypatch.setenv("KUBE_VERSION", "v1.36.5")
    with pytest.raises(ValueError, match=r"no gates to turn on for v1\.36\.5"):
        versions.run_gates()


def test_every_gated_minor_is_a_supported_older_release() -> None:
    assert set(versions.GATED) <= set(RELEASES)
    assert all(versions.GATED.values())
