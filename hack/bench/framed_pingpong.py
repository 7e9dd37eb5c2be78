"""The floor of an authenticated protocol in CPython: a TCP ping-pong that does only what
every frame of the remote GPU protocol must do, and nothing else.

Each request is one header (``remote_gpu.protocol.pack``: the struct and its keyed
BLAKE2b MAC) followed by its payload; the peer process checks the header
(``protocol.unpack``: MAC and fields), reads the payload into a buffer and answers with a
header and the payload, which the caller checks and reads into a new array, as a caller
of ``RemoteGPU.invoke`` gets it. Both sides wait the way the TCP transport does: looking
without sleeping (``tcp.Reader.spin``). Left out: futures, slots, sequence checks, the
allow-list, the function call, metrics. No transport written in Python can make a call
cheaper than this, so the ratio of this floor to ``sockperf`` bounds what the transport
can reach on the machine (``calls_vs_ceiling_4kib``).

A library of ``hack/bench/remote_gpu.py``, not a benchmark of its own: that bench prints
the goals, ends with its JSON and exits non-zero when a goal is missed.
"""

from __future__ import annotations

import multiprocessing as mp
import select
import socket
import time

import numpy as np

from hack.bench import placement
from remote_gpu.client import SPIN
from remote_gpu.protocol import HEADER_SIZE, MAX_META, Op, pack, unpack
from remote_gpu.transports.tcp import Reader, tune

_KEY = b"framed-pingpong-key-0123456789ab"
_LEASE = 1


def _read(reader: Reader, view: memoryview) -> None:
    """Spin, then sleep until readable: an idle side takes no CPU from the others."""
    if not reader.spin(SPIN):
        select.select([reader.sock], [], [])
    reader.read_into(view)


def _peer(listener: socket.socket, size: int) -> None:
    conn, _ = listener.accept()
    tune(conn)
    reader = Reader(conn)
    head = memoryview(bytearray(HEADER_SIZE))
    body = memoryview(bytearray(size))
    with conn:
        while True:
            try:
                _read(reader, head)
            except ConnectionError:
                return
            h = unpack(head, _KEY, size)
            reader.read_into(body[: h.length])
            reply = pack(_KEY, Op.RESULT, _LEASE, h.seq, length=h.length)
            conn.sendmsg([reply, body[: h.length]])


class FramedPingPong:
    """A peer process answering framed requests of up to ``size`` bytes."""

    def __init__(self, size: int) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self._proc = mp.get_context("fork").Process(
            target=_peer, args=(listener, size), daemon=True
        )
        self._proc.start()
        placement.place_server(self._proc.pid or 0)
        self.sock = socket.create_connection(listener.getsockname())
        listener.close()
        tune(self.sock)
        self._reader = Reader(self.sock)
        self._head = memoryview(bytearray(HEADER_SIZE))
        self._seq = 0

    def call(self, data: np.ndarray) -> np.ndarray:
        """One round trip of ``data``; the answer in a new array."""
        self._seq += 1
        payload = memoryview(data.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        head = pack(_KEY, Op.INVOKE, _LEASE, self._seq, length=len(payload))
        self.sock.sendmsg([head, payload])
        _read(self._reader, self._head)
        h = unpack(self._head, _KEY, max(len(payload), MAX_META))
        if h.seq != self._seq:
            raise RuntimeError(f"answer {h.seq} to request {self._seq}")
        out = np.empty(h.length, np.uint8)
        self._reader.read_into(memoryview(out))  # type: ignore[arg-type]
        return out

    def round_trips_per_s(self, data: np.ndarray, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            self.call(data)
        return n / (time.perf_counter() - start)

    def close(self) -> None:
        self.sock.close()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)
