"""Admission control: refuse a lease whose traffic would saturate the donor's link.

Each lease declares the bytes a frame moves and the frames per second it targets; its
demand is their product. A new lease is admitted while the sum of demands of the leases
held, plus its own, stays within ``headroom`` x the measured link bandwidth.
"""

from __future__ import annotations

import math
import socket
import threading
import time

from remote_gpu import metrics


class AdmissionController:
    def __init__(self, bandwidth_bps: float | None, headroom: float = 1.0) -> None:
        self.bandwidth = bandwidth_bps
        self.headroom = headroom
        self._held: dict[int, float] = {}
        self._lock = threading.Lock()
        metrics.LINK_CAPACITY.set(0 if math.isinf(self.capacity) else self.capacity)

    @staticmethod
    def demand(frame_bytes: int, target_rate: float) -> float:
        return max(0, frame_bytes) * max(0.0, target_rate)

    @property
    def capacity(self) -> float:
        return math.inf if self.bandwidth is None else self.bandwidth * self.headroom

    @property
    def load(self) -> float:
        with self._lock:
            return sum(self._held.values())

    def try_admit(self, lease: int, demand: float) -> bool:
        with self._lock:
            if sum(self._held.values()) + demand > self.capacity:
                return False
            self._held[lease] = demand
            metrics.LINK_ADMITTED.set(sum(self._held.values()))
            return True

    def release(self, lease: int) -> None:
        with self._lock:
            self._held.pop(lease, None)
            metrics.LINK_ADMITTED.set(sum(self._held.values()))

    def predict_max_leases(self, demand: float) -> int:
        """How many leases of equal ``demand`` fit the link."""
        if demand <= 0 or self.bandwidth is None:
            return 2**31
        return int(self.capacity // demand)


def measure_bandwidth(host: str = "127.0.0.1", seconds: float = 1.0, chunk: int = 1 << 20) -> float:
    """Bytes per second one TCP stream reaches to a sink on ``host`` (median of 3 runs)."""
    rates = []
    for _ in range(3):
        rates.append(_one_stream(host, seconds / 3, chunk))
    return sorted(rates)[1]


def _one_stream(host: str, seconds: float, chunk: int) -> float:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(1)
    received = [0]
    done = threading.Event()

    def sink() -> None:
        conn, _ = listener.accept()
        buf = bytearray(chunk)
        with conn:
            while True:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                received[0] += n
        done.set()

    t = threading.Thread(target=sink, daemon=True)
    t.start()
    data = bytes(chunk)
    with socket.create_connection(listener.getsockname()) as out:
        start = time.perf_counter()
        sent = 0
        while time.perf_counter() - start < seconds:
            out.sendall(data)
            sent += chunk
        out.shutdown(socket.SHUT_WR)
        done.wait(60)
        elapsed = time.perf_counter() - start
    listener.close()
    return received[0] / elapsed
