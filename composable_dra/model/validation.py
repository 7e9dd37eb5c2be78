"""A pydantic ValidationError as one line a user can act on."""

from __future__ import annotations

from pydantic import ValidationError


def problems(exc: ValidationError, root: str) -> str:
    """Each field's path (``root`` for the object itself) and what is wrong with it."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg']}" for e in exc.errors()
    )
