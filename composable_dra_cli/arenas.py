"""Few glibc malloc arenas for the suite's processes (set by the CLI before any thread).

glibc gives each new thread a malloc arena of its own, up to 8 per core, and memory freed
in an arena stays mapped for that arena's next use. The operator's 64 I/O threads each
parse fabric inventories and API answers in turn, so each arena came to hold a transient
peak of its own (docs/attach-flow.md, Scale).
Two arenas are enough: the GIL serialises most allocation anyway. ``MALLOC_ARENA_MAX``
in the environment, when set, is left to decide.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def limit(count: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas at ``count``; False where that is not glibc on Linux
    or the environment already says."""
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)  # the process's own C library
    if not hasattr(libc, "gnu_get_libc_version"):
        return False  # not glibc (musl's mallopt does nothing)
    return bool(libc.mallopt(M_ARENA_MAX, count))
