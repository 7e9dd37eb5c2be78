"""Concurrent attaches of one block: exactly one wins, the rest get 409."""

from __future__ import annotations

import threading

import requests

from fabric_emulator.testing import EmulatorProcess

from .conftest import BLOCKS, ROOT, message_ids


def _race(url: str, block: str, hosts: list[str]) -> list[requests.Response]:
    barrier = threading.Barrier(len(hosts))
    results: list[requests.Response | None] = [None] * len(hosts)

    def attach(i: int, host: str) -> None:
        s = requests.Session()
        s.auth = ("admin", "admin")
        barrier.wait(timeout=10)
        results[i] = s.post(
            f"{url}{ROOT}/Systems/{host}/Actions/ComputerSystem.AddResourceBlock",
            json={"ResourceBlock": {"@odata.id": f"{BLOCKS}/{block}"}},
            timeout=30,
        )

    threads = [threading.Thread(target=attach, args=(i, h)) for i, h in enumerate(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def test_concurrent_attach_of_one_block(emu: EmulatorProcess) -> None:
    # A latency fault holds every attach in flight, so they all overlap on the server.
    emu.add_fault({"kind": "latency", "latency": 0.2, "path": "AddResourceBlock$"})
    for block in ("gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"):
        results = _race(emu.url, block, ["node-1", "node-2", "node-1", "node-2"])
        codes = sorted(r.status_code for r in results)
        assert codes == [200, 409, 409, 409], [r.text for r in results]
        for r in results:
            if r.status_code == 409:
                assert message_ids(r) == ["Composition.1.1.ResourceBlockInUse"]
        winner = emu.state()["blocks"][block]["system"]
        assert winner in ("node-1", "node-2")
        # the block is linked from exactly one system
        holders = [h for h, s in emu.state()["systems"].items() if block in s["blocks"]]
        assert holders == [winner]


def test_concurrent_async_attach_of_one_block(emu: EmulatorProcess) -> None:
    emu.configure(async_polls=1)
    emu.add_fault({"kind": "latency", "latency": 0.2, "path": "AddResourceBlock$"})
    results = _race(emu.url, "gpu-6", ["node-2", "node-3", "node-2"])
    assert sorted(r.status_code for r in results) == [202, 409, 409]
