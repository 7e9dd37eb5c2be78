"""Transports behind one interface, chosen per connection.

A transport moves frames: ``send_frames`` takes (header, inline payload or None) pairs,
``recv_header`` returns the next fixed-size header, ``recv_payload_into`` fills a buffer
with the inline payload that follows it. TCP and UCX are stream transports; shared
memory rides on either as a control channel and moves array payloads through the lease's
arena instead of inline (the SHM flag). ``choose`` picks one for a connection.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

from remote_gpu.protocol import HEADER_SIZE
from remote_gpu.protocol import Buffer as Buffer  # re-exported: the transports' frame types
from remote_gpu.protocol import Frame as Frame

TRANSPORTS = ("shm", "ucx", "tcp")


def pieces(frames: Sequence[Frame]) -> list[memoryview]:
    """The frames as the byte views that go on the wire, in order (empty payloads left
    out), for a scatter-gather send or one message each: no copies."""
    out: list[memoryview] = []
    for header, payload in frames:
        out.append(memoryview(header))
        if payload is not None and len(payload):
            out.append(memoryview(payload).cast("B"))
    return out


class ClientTransport(ABC):
    """Blocking transport used by the client library."""

    name: str = ""

    @abstractmethod
    def send_frames(self, frames: Sequence[Frame], drain: Callable[[], bool] | None = None) -> None:
        """Send frames. A transport that can block on a full link calls ``drain`` (if
        given) meanwhile; it reads a reply and says whether it could."""

    @abstractmethod
    def recv_into(self, view: memoryview) -> None: ...

    def recv_header(self) -> bytes | bytearray:
        buf = bytearray(HEADER_SIZE)
        self.recv_into(memoryview(buf))
        return buf

    def recv_payload_into(self, view: memoryview) -> None:
        self.recv_into(view)

    def wait_readable(self, timeout: float | None, spin: float = 0.0) -> bool:
        """Whether a frame can be read now or within ``timeout`` seconds (None: wait),
        looking without sleeping for the first ``spin`` seconds where the transport can.

        Transports that cannot tell say True: the read that follows then blocks."""
        return True

    def fileno(self) -> int | None:
        """A descriptor that polls readable when a frame arrives, if there is one."""
        return None

    def buffered(self) -> bool:
        """Whether bytes already read from the connection wait here (``fileno`` would not
        poll readable for them)."""
        return False

    @abstractmethod
    def close(self) -> None: ...


class ServerTransport(ABC):
    """Asyncio transport used by the donor."""

    name: str = ""
    peer: str = ""

    @abstractmethod
    async def send_frames(self, frames: Sequence[Frame]) -> None: ...

    @abstractmethod
    async def recv_into(self, view: memoryview) -> None: ...

    async def recv_header(self) -> bytearray:
        buf = bytearray(HEADER_SIZE)
        await self.recv_into(memoryview(buf))
        return buf

    async def recv_payload_into(self, view: memoryview) -> None:
        await self.recv_into(view)

    @abstractmethod
    def close(self) -> None: ...


def host_id() -> str:
    """Identifies this host's shared-memory domain: boot id plus the /dev/shm inode."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown"
    try:
        st = os.stat("/dev/shm")  # noqa: S108 - identifies the shm mount, writes nothing
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "none"
    return f"{boot}/{shm}"


def ucx_available() -> bool:
    from remote_gpu.transports import ucx

    ok: bool = ucx.available()
    return ok


def choose(requested: str, donor_offers: Sequence[str], same_host: bool) -> str:
    """The transport for a connection: ``requested`` if given, else the best one offered.

    Preference: shared memory on the same host, then UCX, then TCP.
    """
    if requested != "auto":
        if requested not in donor_offers:
            raise ValueError(f"transport {requested!r} is not offered by the donor")
        if requested == "shm" and not same_host:
            raise ValueError("shared memory needs the client on the donor's host")
        return requested
    for name in TRANSPORTS:
        if name == "shm" and not same_host:
            continue
        if name in donor_offers:
            return name
    return "tcp"
