"""Per-lease tokens: HMAC-SHA256 over (lease, donor, expiry) with the donor's secret.

The token file (mounted 0400 into the pod) is JSON: ``{"lease", "donor", "expiry", "mac"}``.
The MAC doubles as the lease's secret: the client proves it holds it (the handshake's
proof of possession) and both sides derive the session key from it, so it never goes on
the wire and must never be logged; :class:`Token`'s repr hides it. The donor recomputes
it from the claims (``mac_for``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_gpu.errors import AuthError


@dataclass(frozen=True)
class Token:
    lease: int
    donor: str
    expiry: float
    mac: str = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"lease": self.lease, "donor": self.donor, "expiry": self.expiry, "mac": self.mac}

    @classmethod
    def from_json(cls, data: Any) -> Token:
        try:
            lease = data["lease"]
            donor = data["donor"]
            expiry = data["expiry"]
            mac = data["mac"]
        except (KeyError, TypeError) as exc:
            raise AuthError(f"malformed token: missing {exc}") from None
        if not (
            isinstance(lease, int)
            and not isinstance(lease, bool)
            and 0 <= lease < 2**64
            and isinstance(donor, str)
            and isinstance(expiry, int | float)
            and not isinstance(expiry, bool)
            and isinstance(mac, str)
        ):
            raise AuthError("malformed token: wrong field types")
        try:
            when = float(expiry)
        except OverflowError:
            when = math.inf
        if not math.isfinite(when):
            raise AuthError("malformed token: expiry is not a finite number")
        return cls(lease=lease, donor=donor, expiry=when, mac=mac)

    @property
    def mac_bytes(self) -> bytes:
        try:
            return bytes.fromhex(self.mac)
        except ValueError:
            raise AuthError("malformed token: mac is not hex") from None


def _digest(secret: bytes, lease: int, donor: str, expiry: float) -> str:
    message = f"remote-gpu/v1|{lease}|{donor}|{expiry!r}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def issue(secret: bytes, lease: int, donor: str, ttl_s: float) -> Token:
    expiry = round(time.time() + ttl_s, 3)
    return Token(lease=lease, donor=donor, expiry=expiry, mac=_digest(secret, lease, donor, expiry))


def verify(secret: bytes, token: Token, donor: str, now: float | None = None) -> None:
    """Raise :class:`AuthError` unless the token is genuine, for this donor, and unexpired."""
    want = _digest(secret, token.lease, token.donor, token.expiry)
    if not hmac.compare_digest(want, token.mac):
        raise AuthError("token signature does not verify")
    check_claims(token.donor, token.expiry, donor, now)


def check_claims(token_donor: str, expiry: float, donor: str, now: float | None = None) -> None:
    """Raise :class:`AuthError` unless the claims are for this donor and unexpired."""
    if token_donor != donor:
        raise AuthError("token is for another donor")
    if (time.time() if now is None else now) >= expiry:
        raise AuthError("token has expired")


def mac_for(secret: bytes, lease: int, donor: str, expiry: float) -> bytes:
    """The MAC of the token with these claims: the lease's secret, as the donor knows it."""
    return bytes.fromhex(_digest(secret, lease, donor, expiry))


def write(path: Path, token: Token) -> None:
    """Write a token file readable by its owner only (0400)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(fd, "w") as fh:
        json.dump(token.to_json(), fh)


def read(path: Path) -> Token:
    try:
        return Token.from_json(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise AuthError(f"cannot read token file {path}: {exc.__class__.__name__}") from None


def read_secret(path: Path) -> bytes:
    secret = path.read_bytes().strip()
    if len(secret) < 16:
        raise ValueError(f"donor secret in {path} is shorter than 16 bytes")
    return secret
