from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from remote_gpu import tokens
from remote_gpu.donor import Donor, DonorConfig

SECRET = b"unit-test-secret-0123456789abcdef"
ALLOW = {
    "echo": "remote_gpu.builtins:echo",
    "add": "remote_gpu.builtins:add",
    "fail": "remote_gpu.builtins:fail",
    "big": "remote_gpu.builtins:big",
}
_leases = itertools.count(1000)


@dataclass
class Running:
    donor: Donor
    loop: asyncio.AbstractEventLoop
    endpoint: str
    host: str
    port: int

    def token(self, ttl: float = 60.0, donor: str | None = None) -> tokens.Token:
        return tokens.issue(SECRET, next(_leases), donor or self.donor.config.name, ttl)


def start_donor(config: DonorConfig) -> tuple[Running, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    donor = Donor(config)
    host, port = asyncio.run_coroutine_threadsafe(donor.start(), loop).result(10)
    return Running(donor, loop, f"{host}:{port}", host, port), thread


def stop_donor(running: Running, thread: threading.Thread) -> None:
    asyncio.run_coroutine_threadsafe(running.donor.close(), running.loop).result(30)
    running.loop.call_soon_threadsafe(running.loop.stop)
    thread.join(10)


@pytest.fixture(scope="module")
def donor() -> Iterator[Running]:
    config = DonorConfig(
        name="donor-a", secret=SECRET, allow=ALLOW, memory_quota=8 << 20, max_credits=4
    )
    running, thread = start_donor(config)
    yield running
    stop_donor(running, thread)


@pytest.fixture(scope="module")
def relayed() -> Iterator[Running]:
    """A donor that relays every request itself (the path UCX connections take)."""
    config = DonorConfig(
        name="donor-r",
        secret=SECRET,
        allow=ALLOW,
        memory_quota=8 << 20,
        max_credits=4,
        direct=False,
    )
    running, thread = start_donor(config)
    yield running
    stop_donor(running, thread)
