"""The bounds of one server, and the connections a process may hold across its servers."""

from __future__ import annotations

import resource
import threading
from collections import Counter
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K")

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


def refusal(held: Held, per_peer: int, total: int) -> str | None:
    """Why one more connection may not be held (None: it may): the process's budget is
    spent, or the peer holds its server's ``per_peer`` share, or half the budget across
    the process's servers (so that one address flooding them all leaves room for others)."""
    if held.total >= total:
        return TOTAL
    if held.peer_here >= per_peer or held.peer >= max(1, total // 2):
        return PER_PEER
    return None


@dataclass(frozen=True)
class Held:
    """Connections held: by one peer at one server, by that peer in all, by everyone."""

    peer_here: int
    peer: int
    total: int


class Budget:
    """Connections held, per peer address (at each server and in all) and in total;
    shared by a process's servers (thread-safe: the metrics endpoint serves from its own
    thread)."""

    def __init__(self, total: int | None = None) -> None:
        if total is None:
            total = descriptor_share(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self.total = total
        self._lock = threading.Lock()
        self._here: Counter[tuple[str, str]] = Counter()
        self._peers: Counter[str] = Counter()

    def take(self, server: str, peer: str, per_peer: int) -> str | None:
        """Hold one connection of ``peer`` at ``server``, or say why not."""
        with self._lock:
            held = Held(self._here[server, peer], self._peers[peer], self._peers.total())
            why = refusal(held, per_peer, self.total)
            if why is None:
                self._here[server, peer] += 1
                self._peers[peer] += 1
            return why

    def give(self, server: str, peer: str) -> None:
        with self._lock:
            _less(self._here, (server, peer))
            _less(self._peers, peer)

    @property
    def held(self) -> int:
        with self._lock:
            return self._peers.total()


def _less(counts: Counter[K], key: K) -> None:
    """One less of ``key``, which is gone at 0: no key is kept for every address that
    ever connected."""
    if counts[key] > 1:
        counts[key] -= 1
    else:
        counts.pop(key, None)


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
