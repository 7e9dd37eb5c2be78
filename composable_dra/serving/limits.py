"""The bounds of one server, and the connections a process may hold across its servers."""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass

# Why a connection was refused or ended (the ``reason`` label of the counter).
PER_PEER = "per_peer"
TOTAL = "total"
HEADER_TIMEOUT = "header_timeout"
BODY_TIMEOUT = "body_timeout"
ACCEPT_FAILED = "accept_failed"


@dataclass(frozen=True)
class ServerLimits:
    """One server's bounds. ``header_timeout`` runs from accept (TLS handshake included)
    to the end of a request's headers, and again from each response to the next request;
    ``body_timeout`` bounds the arrival of a request's body once its headers are in;
    ``max_body`` is the application's ``client_max_size``."""

    per_peer: int = 64
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_body: int = 1 << 20


def descriptor_share(soft_limit: int) -> int:
    """Connections all of a process's servers may hold together: half its descriptors,
    leaving the rest to listeners, logs, worker pipes, arenas and outgoing calls."""
    return max(8, soft_limit // 2)


def refusal(peer_held: int, total_held: int, per_peer: int, total: int) -> str | None:
    """Why one more connection may not be held (None: it may). One peer never holds more
    than half the total, so a single flooding address leaves room for the others."""
    if total_held >= total:
        return TOTAL
    if peer_held >= min(per_peer, max(1, total // 2)):
        return PER_PEER
    return None


class Budget:
    """Connections held, per peer address and in total; shared by a process's servers
    (thread-safe: the metrics endpoint serves from its own thread)."""

    def __init__(self, total: int | None = None) -> None:
        if total is None:
            total = descriptor_share(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self.total = total
        self._lock = threading.Lock()
        self._peers: dict[str, int] = {}
        self._held = 0

    def take(self, peer: str, per_peer: int) -> str | None:
        """Hold one connection of ``peer``, or say why not."""
        with self._lock:
            why = refusal(self._peers.get(peer, 0), self._held, per_peer, self.total)
            if why is None:
                self._peers[peer] = self._peers.get(peer, 0) + 1
                self._held += 1
            return why

    def give(self, peer: str) -> None:
        with self._lock:
            left = self._peers.pop(peer, 0) - 1
            if left > 0:
                self._peers[peer] = left
            self._held = max(0, self._held - 1)

    @property
    def held(self) -> int:
        with self._lock:
            return self._held


_process: Budget | None = None
_process_lock = threading.Lock()


def process_budget() -> Budget:
    """The budget every server of this process shares (sized on first use from the
    descriptor limit then in force)."""
    global _process
    with _process_lock:
        if _process is None:
            _process = Budget()
        return _process
