"""What a publisher pass reads of each claim, derived once per claim object."""

from __future__ import annotations

from composable_dra.k8s.derived import Derived
from composable_dra.k8s.kube import JSON
from pool_publisher.claim_use import ClaimUse, claim_use, held, waiting
from tests.unit.pool_publisher.test_window import claim, exactly, first_available


def allocated(*results: tuple[str, str, str], deleting: bool = False) -> JSON:
    c = claim(allocated=True, deleting=deleting)
    c["status"]["allocation"]["devices"]["results"] = [
        {"request": "gpu", "driver": d, "pool": p, "device": dev} for d, p, dev in results
    ]
    return c


def test_an_allocation_holds_its_devices_until_it_ends_even_while_the_claim_is_deleted() -> None:
    claims = [
        allocated(("ours", "fab/z1", "gpu-1"), ("other", "node-a", "gpu-0")),
        allocated(("ours", "fab/z2", "gpu-7"), deleting=True),
        claim(requests=[exactly("composable-gpu")]),
    ]
    uses = [claim_use(c) for c in claims]
    assert held(uses, {"ours"}) == {("fab/z1", "gpu-1"), ("fab/z2", "gpu-7")}
    assert held(uses, {"ours", "other"}) == {
        ("fab/z1", "gpu-1"),
        ("fab/z2", "gpu-7"),
        ("node-a", "gpu-0"),
    }
    assert not any(u.waiting for u in uses[:2])


def test_a_claim_waits_unallocated_and_not_deleted_for_the_classes_it_asks() -> None:
    mine = claim(requests=[first_available("composable-gpu-local", "composable-gpu")])
    other = claim(requests=[exactly("x")])
    gone = claim(deleting=True, requests=[exactly("composable-gpu")])
    claims = [mine, other, gone, allocated()]
    uses = [claim_use(c) for c in claims]
    assert uses[0] == ClaimUse(waiting=True, classes=("composable-gpu-local", "composable-gpu"))
    assert waiting(claims, uses, {"composable-gpu"}) == [mine]
    assert waiting(claims, uses) == [mine, other]


def test_a_pass_reads_again_only_the_claims_that_changed() -> None:
    read: list[JSON] = []

    def counted(c: JSON) -> ClaimUse:
        read.append(c)
        return claim_use(c)

    uses = Derived(counted)
    claims = [claim(requests=[exactly("composable-gpu")]) for _ in range(3)]
    uses.map(claims)
    changed = allocated(("ours", "fab/z1", "gpu-1"))
    after = held(uses.map([claims[0], changed, claims[2]]), {"ours"})
    assert after == {("fab/z1", "gpu-1")}
    assert read == [*claims, changed]
