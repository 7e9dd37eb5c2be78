"""Buffers for results copied out to the caller, used again once the caller drops them.

A result that is not a view of the arena is copied into a new array. With a new
``np.empty`` for each large result, glibc hands the memory back to the kernel as the
caller frees results out of order (``free`` trims the heap top past ``M_TRIM_THRESHOLD``,
128 KiB to a few MiB) and takes it again for the next one: every page of every result
then costs a page fault. On the development machine that tripled the time of a 1 MiB
call over shared memory (416 against 101 us; the copies themselves take ~65).

So large results are slices of buffers kept here. A buffer is handed out again only when
no result made from it is alive: every result's ``base`` is its buffer (numpy collapses
the chain of views), so the buffer's reference count says so, as with the arena's pins.
At most ``keep`` buffers are kept; past that a result gets an array of its own.
"""

from __future__ import annotations

import math
import sys

import numpy as np

# Below this, malloc serves arrays from its heap without trimming it for each: recycling
# them would not save page faults, only take memory.
SMALLEST = 128 << 10


class Spares:
    """Result buffers of one client (used under its read lock: one thread at a time)."""

    def __init__(self, keep: int, smallest: int = SMALLEST) -> None:
        self.keep = keep
        self.smallest = smallest
        self._bufs: list[np.ndarray] = []
        # The count of a kept buffer nobody else holds (the list's reference and the
        # argument's), measured as it will be read.
        probe = [np.empty(0)]
        self._unused = sys.getrefcount(probe[0])

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.smallest:
            return np.empty(shape, dtype)
        bufs = self._bufs
        for i in range(len(bufs)):
            if bufs[i].nbytes >= nbytes and sys.getrefcount(bufs[i]) <= self._unused:
                return bufs[i][:nbytes].view(dtype).reshape(shape)
        buf = np.empty(nbytes, np.uint8)
        if len(bufs) < self.keep:
            bufs.append(buf)
        else:  # a free buffer too small for this result gives way to it
            for i in range(len(bufs)):
                if sys.getrefcount(bufs[i]) <= self._unused:
                    bufs[i] = buf
                    break
        return buf.view(dtype).reshape(shape)

    def clear(self) -> None:
        """Let go of every buffer (those results still hold stay theirs)."""
        self._bufs = []
