"""The scaler's decision stays linear in the cluster: per pass, each claim's allocation
results are read a bounded number of times, however many resources are released."""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from typing import Any

import pytest

from device_scaler import decide as decide_package
from device_scaler.decide import Memo, PatchResource, ScalerSnapshot, decide, reading
from device_scaler.decide.release import ended_allocations
from device_scaler.decide.view import index
from tests.unit.device_scaler.test_scaler import CFG, claim, resource, snap


def cluster(n: int) -> tuple[ScalerSnapshot, int, int]:
    """n nodes' worth: 8 allocated local GPUs per node, n pool allocations that last with
    their resources, n resources whose claims are gone, n idle GPUs. Also the number of
    claims and of resources."""
    local = [
        claim(uid=f"p{i}", device=f"local-{i}", pool=f"node-{i % n}", binding=False)
        for i in range(8 * n)
    ]
    live = [claim(uid=f"c{i}", device=f"gpu-{i}") for i in range(n)]
    held = [
        resource(claim_uid=f"c{i}", device=f"gpu-{i}", phase="Online", uuid=f"U{i}")
        for i in range(n)
    ]
    released = [
        resource(claim_uid=f"gone{i}", device=f"gpu-r{i}", phase="Online", uuid=f"R{i}")
        for i in range(n)
    ]
    idle = [
        resource(claim_uid=None, device=f"gpu-i{i}", phase="Online", uuid=f"I{i}", name=f"i{i}")
        for i in range(n)
    ]
    claims, resources = local + live, held + released + idle
    return snap(claims, resources, pool=()), len(claims), len(resources)


def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = reading.our_results

    def spy(c: Any, driver: str) -> Any:
        calls[0] += 1
        return real(c, driver)

    # Every phase module that reads allocation results, each through its own import.
    for info in pkgutil.iter_modules(decide_package.__path__):
        module = importlib.import_module(f"{decide_package.__name__}.{info.name}")
        if getattr(module, "our_results", None) is real:
            monkeypatch.setattr(module, "our_results", spy)
    return calls


@pytest.mark.parametrize("n", [10, 40])
def test_the_release_phase_reads_each_claim_once_and_each_holder_once(
    monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    s, claims, resources = cluster(n)
    calls = counted_reads(monkeypatch)
    actions, idle = ended_allocations(index(s, CFG))
    assert len(actions) == n
    assert all(isinstance(a, PatchResource) and a.reason == "Released" for a in actions)
    assert len(idle) == n
    # One (node, device) -> claim map per pass, one look at each live holder: no scan of
    # every claim per released resource (that would be n x 9n reads).
    assert calls[0] <= claims + resources


def test_a_whole_pass_grows_linearly_with_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = counted_reads(monkeypatch)
    reads = []
    for n in (10, 40):
        s, _, _ = cluster(n)
        calls[0] = 0
        decide(s, CFG)
        reads.append(calls[0])
    assert reads[0] > 0  # the spy sees the phases' reads
    assert reads[1] == 4 * reads[0]


def test_with_a_memo_a_pass_reads_only_the_claims_that_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scaler keeps a Memo between passes: the informer keeps an unchanged claim's
    object, so a second pass over the same objects reads none of them again (only the
    holders of live resources), and a replaced object is read afresh."""
    s, claims, resources = cluster(10)
    memo = Memo(CFG.driver)
    calls = counted_reads(monkeypatch)
    first = decide(s, CFG, memo)
    assert calls[0] >= claims
    calls[0] = 0
    assert decide(s, CFG, memo) == first
    assert calls[0] <= resources
    changed = claim(uid="c0", device="gpu-0", allocated=False)  # its allocation ended
    calls[0] = 0
    kept = [c for c in s.claims if c["metadata"]["uid"] != "c0"]
    again = decide(replace(s, claims=[*kept, changed]), CFG, memo)
    assert 1 <= calls[0] <= resources + 1
    released = [a for a in again if isinstance(a, PatchResource) and a.reason == "Released"]
    assert len(released) == 11  # c0's resource too: the changed claim was read
