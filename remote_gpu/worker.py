"""The worker process of one lease: runs allow-listed functions on views of the arena.

Protocol with the donor over a pipe (pickled tuples):
  donor -> worker: ``(seq, slot, name, [(dtype, shape, offset, length), ...])`` or None to stop
  worker -> donor: ``("ok", seq, [(dtype, shape, offset, length), ...], seconds)``
                   ``("err", seq, code, message)``; first of all ``("ready",)``
Results that are already views of the request's slot are returned in place; others are
copied into the slot after the inputs, and must fit (the lease's memory quota).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from remote_gpu.arena import Arena, align
from remote_gpu.errors import Code
from remote_gpu.protocol import dtype_code

ArraySpec = tuple[int, tuple[int, ...], int, int]


def resolve(path: str) -> Callable[..., Any]:
    """Import ``module:function`` (or ``module.function``)."""
    module, sep, name = path.partition(":")
    if not sep:
        module, _, name = path.rpartition(".")
    obj: Any = importlib.import_module(module)
    for attr in name.split("."):
        obj = getattr(obj, attr)
    if not callable(obj):
        raise TypeError(f"{path} is not callable")
    return obj  # type: ignore[no-any-return]


def _run_one(
    arena: Arena, fn: Callable[..., Any], slot: int, specs: Sequence[ArraySpec]
) -> list[ArraySpec]:
    base = arena.slot_base(slot)
    end = base + arena.slot_size
    args = [arena.array(off, dtype, shape) for dtype, shape, off, _ in specs]  # type: ignore[arg-type]
    out = fn(*args)
    results = list(out) if isinstance(out, tuple | list) else [out]
    free = align(max((off + n for _, _, off, n in specs), default=base))
    replies: list[ArraySpec] = []
    for r in results:
        arr = np.asarray(r)
        code = int(dtype_code(arr.dtype))
        shape = tuple(int(d) for d in arr.shape)
        offset = arena.contains(arr, base, end)
        if offset is None:
            if free + arr.nbytes > end:
                raise MemoryError(
                    f"results need more than the {arena.slot_size}-byte slot of this lease"
                )
            arena.buf[free : free + arr.nbytes] = (
                np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            )
            offset = free
            free = align(free + arr.nbytes)
        replies.append((code, shape, offset, arr.nbytes))
    return replies


def main(conn: Connection, arena_path: str, size: int, slots: int, allow: dict[str, str]) -> None:
    arena = Arena.attach(arena_path, size, slots)
    functions: dict[str, Callable[..., Any]] = {}
    for name, path in allow.items():
        functions[name] = resolve(path)
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        seq, slot, name, specs = msg
        fn = functions.get(name)
        if fn is None:
            conn.send(("err", seq, Code.NOT_ALLOWED.value, f"{name!r} is not allowed"))
            continue
        start = time.perf_counter()
        try:
            replies = _run_one(arena, fn, slot, specs)
        except MemoryError as exc:
            conn.send(("err", seq, Code.MEMORY_QUOTA.value, str(exc)))
        except Exception as exc:
            conn.send(("err", seq, Code.FUNCTION_FAILED.value, f"{type(exc).__name__}: {exc}"))
        else:
            conn.send(("ok", seq, replies, time.perf_counter() - start))
    arena.close()
