"""Kubernetes quantities for memory: canonical strings out, bytes in."""

from __future__ import annotations

import re
from decimal import Decimal

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$")


def parse_bytes(value: int | str) -> int:
    """Bytes from an integer or a quantity string ("80Gi", "512M", "1024")."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError("memory must not be negative")
        return value
    match = _QUANTITY.match(value.strip())
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = match.groups()
    scale = _BINARY.get(suffix) or _DECIMAL.get(suffix) or (1 if suffix == "" else None)
    if scale is None:
        raise ValueError(f"unknown quantity suffix in {value!r}")
    return int(Decimal(number) * scale)


def format_bytes(n: int) -> str:
    """The canonical form the API server keeps: the largest binary suffix that divides n.

    Writing what the server would write back means the observed slice equals the desired
    one, so no update loop starts over a reformatted number.
    """
    for suffix, scale in reversed(_BINARY.items()):
        if n and n % scale == 0:
            return f"{n // scale}{suffix}"
    return str(n)
