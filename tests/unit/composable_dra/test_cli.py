from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import pytest

import composable_dra_cli as cli
from dra_driver.flags import env_flag, positive_seconds


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert "composable-dra" in capsys.readouterr().out


def test_a_subcommand_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


def _without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if the 'remote' extra (numpy) were not installed."""
    for name in list(sys.modules):
        if name == "numpy" or name.startswith(("numpy.", "remote_gpu")):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "numpy", None)  # the next import of it fails


def test_without_the_remote_extra_the_donor_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_numpy(monkeypatch)
    assert cli.main(["remote-gpu-donor", "--port", "0"]) == 2
    assert "install the 'remote' extra" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # every other component still parses its flags
        cli.main(["fabric-emulator", "--help"])
    assert exc.value.code == 0
    with pytest.raises(ModuleNotFoundError, match="composable-dra\\[remote\\]"):
        importlib.import_module("remote_gpu.client")


def _env_flag_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    env_flag(p, "--state-dir", "/default", type=Path)
    env_flag(p, "--link-gbps", type=int)
    env_flag(p, "--uid", "", env="POD_UID")
    return p


def test_env_flag_reads_the_variable_named_like_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIR", "/from-env")
    monkeypatch.setenv("LINK_GBPS", "25")
    monkeypatch.setenv("POD_UID", "abc")
    args = _env_flag_parser().parse_args([])
    assert (args.state_dir, args.link_gbps, args.uid) == (Path("/from-env"), 25, "abc")
    # The flag wins over the environment.
    assert _env_flag_parser().parse_args(["--link-gbps=7"]).link_gbps == 7


def test_env_flag_empty_or_unset_gives_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIR", "")
    monkeypatch.delenv("LINK_GBPS", raising=False)
    monkeypatch.delenv("POD_UID", raising=False)
    args = _env_flag_parser().parse_args([])
    assert (args.state_dir, args.link_gbps, args.uid) == (Path("/default"), None, "")


def test_env_flag_bad_variable_fails_like_a_bad_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LINK_GBPS", "fast")
    with pytest.raises(SystemExit) as exc:
        _env_flag_parser().parse_args([])
    assert exc.value.code == 2
    assert "--link-gbps" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon", ""])
def test_positive_seconds_refuses_what_is_no_period(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--health-resend", type=positive_seconds)
    with pytest.raises(SystemExit) as exc:
        p.parse_args([f"--health-resend={bad}"])
    assert exc.value.code == 2
    assert "--health-resend" in capsys.readouterr().err
    assert p.parse_args(["--health-resend=0.5"]).health_resend == 0.5
