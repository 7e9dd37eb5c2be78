"""What a claim reference from the kubelet may contain, checked before anything uses it.

The UID names the claim's CDI spec file and its CDI device names; the namespace and name
go into an API path. A reference that could not come from the API server (a UID with a
slash, a name with ``..``) is refused for that claim only, before any file or URL is built.
"""

from __future__ import annotations

import re

# Kubernetes UIDs are RFC 4122 UUIDs; accept any plain token of that alphabet so that a
# test or another runtime's UID still works, but never a separator or a dot.
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,127}")
# DNS-1123 label (namespaces) and subdomain (ResourceClaim names), as the API server checks.
_NAMESPACE = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_PART = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_PART}(?:\.{_PART})*")
_MAX_SUBDOMAIN = 253


class InvalidClaimRef(ValueError):
    """A claim reference that no API server could have produced."""


def is_uid(value: str) -> bool:
    return _UID.fullmatch(value) is not None


def problem(namespace: str, name: str, uid: str) -> str | None:
    """Why this reference is refused, or None when it is well formed."""
    if not is_uid(uid):
        return f"invalid claim UID {uid!r}: expected letters, digits and '-' (a UUID)"
    if _NAMESPACE.fullmatch(namespace) is None:
        return f"invalid claim namespace {namespace!r}: expected a DNS-1123 label"
    if len(name) > _MAX_SUBDOMAIN or _SUBDOMAIN.fullmatch(name) is None:
        return f"invalid claim name {name!r}: expected a DNS-1123 subdomain"
    return None


def check_uid(uid: str) -> str:
    """``uid`` if it is safe in a file name; InvalidClaimRef otherwise."""
    if not is_uid(uid):
        raise InvalidClaimRef(f"invalid claim UID {uid!r}")
    return uid
