from __future__ import annotations

import importlib
import sys

import pytest

from composable_dra import cli


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
