"""A lease's memory: one shared-memory file cut into equal slots, one per credit.

The arena is the lease's memory quota. Payloads arriving over TCP are received straight
into a slot, the worker computes on views of it, and results leave from it; with the
shared-memory transport the client writes its arrays there itself. A shared-memory lease
may also carry a control block after the slots (see ``ring``) and two FIFOs beside the
file, its doorbells.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import secrets
from pathlib import Path

import numpy as np

from remote_gpu.protocol import DType, numpy_dtype

SHM_DIR = Path("/dev/shm")  # noqa: S108 - files are created O_EXCL, mode 0600, random names
ALIGN = 64
PAGE = 4096


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


class Arena:
    def __init__(self, path: Path, size: int, slots: int, slot_size: int, owner: bool) -> None:
        if slots < 1 or slot_size < 1 or slots * slot_size > size:
            raise ValueError(f"{slots} slots of {slot_size} bytes do not fit {size} bytes")
        self.path = path
        self.size = size
        self.slots = slots
        self.slot_size = slot_size
        self.data_size = slots * slot_size
        self.ctl_offset = self.data_size  # the control block, if any, follows the slots
        self.owner = owner
        fd = os.open(path, os.O_RDWR)
        try:
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buf = np.frombuffer(self._mmap, dtype=np.uint8)
        self.address: int = self.buf.ctypes.data

    @classmethod
    def create(cls, quota_bytes: int, slots: int, ctl_size: int = 0) -> Arena:
        """A new arena; with ``ctl_size``, a control block of that size after the slots
        and the two doorbell FIFOs (``doorbells()``)."""
        slot_size = max(PAGE, quota_bytes // slots // PAGE * PAGE)
        size = slot_size * slots + align(ctl_size, PAGE)
        path = SHM_DIR / f"remote-gpu-{secrets.token_hex(8)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
        arena = cls(path, size, slots, slot_size, owner=True)
        if ctl_size:
            for fifo in arena.doorbells():
                os.mkfifo(fifo, 0o600)
        return arena

    @classmethod
    def attach(cls, path: str, size: int, slots: int, slot_size: int) -> Arena:
        return cls(Path(path), size, slots, slot_size, owner=False)

    def doorbells(self) -> tuple[Path, Path]:
        """The FIFOs that wake the worker (requests) and the client (responses)."""
        return self.path.with_name(self.path.name + ".req"), self.path.with_name(
            self.path.name + ".rsp"
        )

    def slot_base(self, slot: int) -> int:
        return slot * self.slot_size

    def slot_of(self, offset: int) -> int | None:
        """The slot whose base is ``offset``, or None if it is not a slot base."""
        if offset % self.slot_size or not 0 <= offset < self.data_size:
            return None
        return offset // self.slot_size

    def view(self, offset: int, length: int) -> memoryview:
        return memoryview(self._mmap)[offset : offset + length]

    def array(self, offset: int, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
        return np.frombuffer(self.buf, numpy_dtype(dtype), math.prod(shape), offset).reshape(shape)

    def contains(self, array: np.ndarray, start: int, end: int) -> int | None:
        """Offset of ``array`` if it is a contiguous view inside [start, end), else None."""
        if not array.flags.c_contiguous:
            return None
        base = self.address
        lo = array.__array_interface__["data"][0]
        hi = lo + array.nbytes
        if base + start <= lo and hi <= base + end:
            return int(lo - base)
        return None

    def close(self) -> None:
        del self.buf
        with contextlib.suppress(BufferError):  # a view is alive; the mapping goes at exit
            self._mmap.close()
        if self.owner:
            self.path.unlink(missing_ok=True)
            for fifo in self.doorbells():
                fifo.unlink(missing_ok=True)
