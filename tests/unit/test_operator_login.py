"""The operator logs in with kopf's own login functions, read afresh at every login: a
rotated token is used the next time kopf logs in (kopf does when a token is refused)."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest
import yaml

from composable_operator.operator_setup import login


def kubeconfig(path: Path, token: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://api.example:6443"}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )


def test_a_rotated_token_is_read_at_the_next_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "kubeconfig"
    kubeconfig(config, "first")
    monkeypatch.setenv("KUBECONFIG", str(config))
    settings = kopf.OperatorSettings()
    info = login(False, settings=settings)
    assert info is not None and (info.server, info.token) == ("https://api.example:6443", "first")
    kubeconfig(config, "rotated")
    info = login(False, settings=settings)
    assert info is not None and info.token == "rotated"
