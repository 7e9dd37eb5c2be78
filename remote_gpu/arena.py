"""A lease's memory: one shared-memory file cut into equal slots, one per credit.

The arena is the lease's memory quota. Payloads arriving over TCP are received straight
into a slot, the worker computes on views of it, and results leave from it; with the
shared-memory transport the client writes its arrays there itself. A shared-memory lease
may also carry a control block after the slots (see ``ring``) and two FIFOs beside the
file, its doorbells.

The file lives in the shm directory under a name the client can check against its lease
(``remote-gpu-<lease as 16 hex digits>-<16 random hex digits>``). Layout: the slots, the
control block if any (page-aligned), and a last page whose first 40 bytes are the donor's
seal: ``b"RGPUSEAL"`` and a keyed BLAKE2b-256 (key: the lease's session key, person
``rgpu-arena``) over the name and the little-endian u64s lease, size, slots, slot size.
The client maps an arena only by a name that passes that check (never a path it is told),
opens it without following links, and checks that it is a regular file of the announced
size with one link, and that the seal verifies, before it writes anything there
(``open_sealed``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import math
import mmap
import os
import re
import secrets
import stat
import struct
from pathlib import Path

import numpy as np

from remote_gpu.errors import AuthError
from remote_gpu.protocol import DType, numpy_dtype

SHM_DIR = Path("/dev/shm")  # noqa: S108 - files are created O_EXCL, mode 0600, random names
ALIGN = 64
PAGE = 4096
SEAL_SIZE = PAGE  # the last page: the seal
_SEAL_MAGIC = b"RGPUSEAL"
_SEAL_LAYOUT = struct.Struct("<QQQQ")
_NAME = re.compile(r"remote-gpu-([0-9a-f]{16})-[0-9a-f]{16}")


def arena_name(lease: int) -> str:
    return f"remote-gpu-{lease:016x}-{secrets.token_hex(8)}"


def arena_path(lease: int, name: str) -> Path:
    """The path of the arena called ``name``, if that is a name the donor gives an arena
    of ``lease``; else :class:`AuthError`."""
    m = _NAME.fullmatch(name)
    if m is None or int(m.group(1), 16) != lease:
        raise AuthError("the donor named an arena that is not this lease's")
    return SHM_DIR / name


def arena_size(slots: int, slot_size: int, ctl_size: int) -> int:
    """Bytes of an arena: the slots, the control block (if any), the seal."""
    return slots * slot_size + align(ctl_size, PAGE) + SEAL_SIZE


def _seal(key: bytes, name: str, lease: int, size: int, slots: int, slot_size: int) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=32, person=b"rgpu-arena")
    h.update(name.encode())
    h.update(_SEAL_LAYOUT.pack(lease, size, slots, slot_size))
    return _SEAL_MAGIC + h.digest()


def align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


class Arena:
    def __init__(
        self, path: Path, size: int, slots: int, slot_size: int, owner: bool, fd: int = -1
    ) -> None:
        """Map the arena at ``path`` (or the file open as ``fd``, which this closes)."""
        try:
            if slots < 1 or slot_size < 1 or slots * slot_size + SEAL_SIZE > size:
                raise ValueError(f"{slots} slots of {slot_size} bytes do not fit {size} bytes")
            if fd < 0:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            self._mmap = mmap.mmap(fd, size)
        finally:
            if fd >= 0:
                os.close(fd)
        self.path = path
        self.size = size
        self.slots = slots
        self.slot_size = slot_size
        self.data_size = slots * slot_size
        self.ctl_offset = self.data_size  # the control block, if any, follows the slots
        self.seal_offset = size - SEAL_SIZE
        self.owner = owner
        self.buf = np.frombuffer(self._mmap, dtype=np.uint8)
        self.address: int = self.buf.ctypes.data

    @classmethod
    def create(cls, quota_bytes: int, slots: int, ctl_size: int = 0, lease: int = 0) -> Arena:
        """A new arena of ``lease``; with ``ctl_size``, a control block of that size after
        the slots and the two doorbell FIFOs (``doorbells()``)."""
        slot_size = max(PAGE, quota_bytes // slots // PAGE * PAGE)
        size = arena_size(slots, slot_size, ctl_size)
        path = SHM_DIR / arena_name(lease)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        arena = cls(path, size, slots, slot_size, owner=True, fd=fd)
        if ctl_size:
            for fifo in arena.doorbells():
                os.mkfifo(fifo, 0o600)
        return arena

    @classmethod
    def attach(cls, path: str, size: int, slots: int, slot_size: int) -> Arena:
        """Map an arena whose path comes from a trusted source (the donor's worker)."""
        return cls(Path(path), size, slots, slot_size, owner=False)

    def seal(self, key: bytes, lease: int) -> None:
        """Write the seal that proves to the client holding ``key`` that this arena was
        made for its lease (the donor, once it knows the session key)."""
        data = _seal(key, self.path.name, lease, self.size, self.slots, self.slot_size)
        self._mmap[self.seal_offset : self.seal_offset + len(data)] = data

    @classmethod
    def open_sealed(
        cls, lease: int, name: str, size: int, slots: int, slot_size: int, key: bytes
    ) -> Arena:
        """Map the arena the donor named, if it is provably this lease's: a checked name in
        the shm directory, no link followed, a regular file of ``size`` bytes with one
        link, and a seal that verifies with the session ``key``. Else :class:`AuthError`;
        nothing is written to the file either way."""
        path = arena_path(lease, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as exc:
            raise AuthError(f"cannot open the lease's arena: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size != size:
                raise AuthError("the lease's arena is not a file of the announced size")
        except BaseException:
            os.close(fd)
            raise
        arena = cls(path, size, slots, slot_size, owner=False, fd=fd)
        want = _seal(key, name, lease, size, slots, slot_size)
        got = bytes(arena._mmap[arena.seal_offset : arena.seal_offset + len(want)])
        if not hmac.compare_digest(got, want):
            arena.close()
            raise AuthError("the lease's arena carries no valid seal")
        return arena

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
        a = np.frombuffer(self.buf, numpy_dtype(dtype), math.prod(shape), offset)
        return a if len(shape) == 1 else a.reshape(shape)  # frombuffer's are 1-D already

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
