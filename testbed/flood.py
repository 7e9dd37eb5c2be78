"""A bounded flood for the end-to-end tests: connections that send half a request and
wait, from a loopback address of their own, re-opened as the servers cut them off.

Bounded in every way: loopback targets only, at most ``per_target`` connections open to
each target at once, and it ends when stopped or after ``seconds``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

ROUND = 0.1  # seconds between rounds of re-opening


@dataclass(frozen=True)
class Target:
    address: tuple[str, int]
    first_bytes: bytes  # half of what the server waits for


Address = tuple[str, int]


def _counts() -> dict[Address, int]:
    return {}


@dataclass
class Tally:
    """Per target: connections opened, refused (connect failed, or cut off within a
    second), cut off later (the servers' deadlines), and open now."""

    opened: dict[Address, int] = field(default_factory=_counts)
    refused: dict[Address, int] = field(default_factory=_counts)
    cut_off: dict[Address, int] = field(default_factory=_counts)
    open_now: dict[Address, int] = field(default_factory=_counts)

    @staticmethod
    def count(counts: dict[Address, int], target: Target, by: int = 1) -> None:
        counts[target.address] = counts.get(target.address, 0) + by


class Flood:
    def __init__(
        self,
        targets: list[Target],
        source: str = "127.0.0.2",
        per_target: int = 150,
        seconds: float = 120.0,
    ) -> None:
        for target in targets:
            if not ipaddress.ip_address(target.address[0]).is_loopback:
                raise ValueError(f"a flood stays on loopback, not {target.address[0]}")
        if not ipaddress.ip_address(source).is_loopback:
            raise ValueError(f"a flood stays on loopback, not {source}")
        self.targets, self.source = targets, source
        self.per_target, self.seconds = per_target, seconds
        self.tally = Tally()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flood", daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self, sel: selectors.BaseSelector, target: Target) -> None:
        try:
            sock = socket.create_connection(
                target.address, timeout=1, source_address=(self.source, 0)
            )
            sock.sendall(target.first_bytes)
        except OSError:
            Tally.count(self.tally.refused, target)
            return
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, (target, time.monotonic()))
        Tally.count(self.tally.opened, target)
        Tally.count(self.tally.open_now, target)

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        deadline = time.monotonic() + self.seconds
        try:
            while time.monotonic() < deadline:
                for target in self.targets:
                    while self.tally.open_now.get(target.address, 0) < self.per_target:
                        self._open(sel, target)
                for key, _ in sel.select(timeout=0):
                    self._reap(sel, key)
                # Pace the rounds (at most per_target new connections a target each), and
                # end at once when stopped.
                if self._stop.wait(ROUND):
                    break
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()

    def _reap(self, sel: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        sock: socket.socket = key.fileobj  # type: ignore[assignment]
        target, opened = key.data
        with contextlib.suppress(BlockingIOError):
            try:
                if sock.recv(65536):
                    return  # the server's greeting (the data plane's CHALLENGE)
            except OSError:
                pass
            sel.unregister(sock)
            sock.close()
            Tally.count(self.tally.open_now, target, -1)
            quick = time.monotonic() - opened < 1.0
            Tally.count(self.tally.refused if quick else self.tally.cut_off, target)
