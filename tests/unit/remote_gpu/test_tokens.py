from __future__ import annotations

import dataclasses
import stat
import time
from pathlib import Path

import pytest

from remote_gpu import tokens
from remote_gpu.errors import AuthError

SECRET = b"0123456789abcdef0123"


def test_issued_token_verifies() -> None:
    tok = tokens.issue(SECRET, 5, "donor-a", 60)
    tokens.verify(SECRET, tok, "donor-a")


def test_tampered_expired_and_foreign_tokens_are_refused() -> None:
    tok = tokens.issue(SECRET, 5, "donor-a", 60)
    with pytest.raises(AuthError, match="signature"):
        tokens.verify(SECRET, dataclasses.replace(tok, lease=6), "donor-a")
    with pytest.raises(AuthError, match="signature"):
        tokens.verify(b"another-secret-of-the-donor", tok, "donor-a")
    with pytest.raises(AuthError, match="another donor"):
        tokens.verify(SECRET, tok, "donor-b")
    with pytest.raises(AuthError, match="expired"):
        tokens.verify(SECRET, tok, "donor-a", now=time.time() + 61)


def test_token_file_is_owner_read_only_and_round_trips(tmp_path: Path) -> None:
    tok = tokens.issue(SECRET, 9, "donor-a", 60)
    path = tmp_path / "token"
    tokens.write(path, tok)
    assert stat.S_IMODE(path.stat().st_mode) == 0o400
    assert tokens.read(path) == tok
    assert tok.mac not in repr(tok)


def test_malformed_token_files_raise_auth_errors(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text('{"lease": "x"}')
    with pytest.raises(AuthError):
        tokens.read(path)
    path.write_text("not json")
    with pytest.raises(AuthError):
        tokens.read(path)
    with pytest.raises(AuthError):
        tokens.read(tmp_path / "missing")
