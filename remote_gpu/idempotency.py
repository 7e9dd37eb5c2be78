"""Which functions a client may run twice: the ``@idempotent`` declaration.

A call in flight when its lease's connection is lost (the donor restarted) may or may not
have run on the donor. The client reconnects on its own (``remote_gpu.reconnect``) and
runs such a call again only where the function says that is harmless: its module marks
it with :func:`idempotent` (as ``remote_gpu.builtins`` does its pure functions). The donor
reads the mark on its allow-list's functions and names the idempotent ones in its ACCEPT;
any other call lost with its connection fails with ``CallInterrupted``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_MARK = "remote_gpu_idempotent"


def idempotent(fn: F) -> F:
    """Declare ``fn`` idempotent: running it twice with the same arguments gives the same
    result and changes nothing else, so a client may retry it after a lost connection."""
    setattr(fn, _MARK, True)
    return fn


def declared(fn: object) -> bool:
    return getattr(fn, _MARK, False) is True


def resolve(path: str) -> object:
    """The object ``module:function`` (or ``module.function``) names."""
    module, sep, name = path.partition(":")
    if not sep:
        module, _, name = path.rpartition(".")
    obj: object = importlib.import_module(module)
    for attr in name.split("."):
        obj = getattr(obj, attr)
    return obj


def idempotent_names(allow: Mapping[str, str]) -> list[str]:
    """The names of an allow-list (name -> ``module:function``) whose functions are
    declared idempotent. A path that does not import is not (its worker reports it)."""
    out = []
    for name, path in sorted(allow.items()):
        try:
            fn = resolve(path)
        except (ImportError, AttributeError, ValueError):
            continue
        if declared(fn):
            out.append(name)
    return out
