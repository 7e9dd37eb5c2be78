"""Authentication: one account, Redfish sessions (X-Auth-Token) and HTTP Basic."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from collections.abc import Mapping

from composable_dra.k8s.timestamps import now_rfc3339
from fabric_emulator.resources import ROOT, SessionInfo

SESSIONS = f"{ROOT}/SessionService/Sessions"

# Readable without credentials (Redfish specification, "Service root" and protocol docs).
_PUBLIC_GET = frozenset({"/redfish", "/redfish/v1", f"{ROOT}/odata", f"{ROOT}/$metadata"})


def is_public(method: str, path: str) -> bool:
    p = path.rstrip("/") or "/"
    if method in ("GET", "HEAD") and p in _PUBLIC_GET:
        return True
    return method == "POST" and p == SESSIONS


def _utf8(text: str) -> bytes:
    """``text`` as bytes for comparison, whatever it holds.

    Header bytes that are not UTF-8 arrive as lone surrogates, and JSON strings may carry
    them: encoded as such (bytes no valid UTF-8 text has), they simply match nothing.
    """
    return text.encode("utf-8", "surrogatepass")


class Auth:
    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self._password = password
        self._by_token: dict[str, SessionInfo] = {}
        self.sessions: dict[str, SessionInfo] = {}  # session id -> session

    def credentials_ok(self, user: object, password: object) -> bool:
        if not isinstance(user, str) or not isinstance(password, str):
            return False
        ok_user = hmac.compare_digest(_utf8(user), self.user.encode())
        ok_pass = hmac.compare_digest(_utf8(password), self._password.encode())
        return ok_user and ok_pass

    def login(self, user: object, password: object) -> tuple[str, SessionInfo] | None:
        if not self.credentials_ok(user, password):
            return None
        token = secrets.token_urlsafe(24)
        info = SessionInfo(id=secrets.token_hex(8), user=self.user, created=now_rfc3339())
        self._by_token[token] = info
        self.sessions[info.id] = info
        return token, info

    def logout(self, session_id: str) -> bool:
        info = self.sessions.pop(session_id, None)
        if info is None:
            return False
        self._by_token = {t: s for t, s in self._by_token.items() if s.id != session_id}
        return True

    def authenticate(self, headers: Mapping[str, str]) -> SessionInfo | str | None:
        """The session of an X-Auth-Token, the user name of valid Basic credentials, or None."""
        token = headers.get("X-Auth-Token")
        if token:
            given = _utf8(token)
            for known, info in self._by_token.items():
                if hmac.compare_digest(known.encode(), given):
                    return info
            return None
        header = headers.get("Authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            raw = base64.b64decode(_utf8(value), validate=True)
            user, sep, password = raw.decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if sep and self.credentials_ok(user, password):
            return user
        return None

    def clear(self) -> None:
        self._by_token.clear()
        self.sessions.clear()
