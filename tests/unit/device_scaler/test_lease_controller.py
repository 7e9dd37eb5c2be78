"""The lease controller's decisions: which remote allocations get a lease, which leases close."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from composable_dra.lending.remote_leases import Code, LeaseAPIError, LeaseInfo, LeaseList
from device_scaler.leases import (
    Close,
    Open,
    RemoteAlloc,
    condition_entry,
    lending_donors,
    merged_status,
    open_failure,
    plan,
    remote_allocations,
    with_retries,
)

DRIVER = "gpu.composable.dra.io"


def claim(
    uid: str,
    device: str = "gpu-0-remote",
    pool: str = "node-a",
    node: str | None = "node-c",
    conditions: list[dict[str, Any]] | None = None,
    data: dict[str, Any] | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    allocation: dict[str, Any] = {
        "devices": {
            "results": [{"request": "gpu", "driver": driver, "pool": pool, "device": device}]
        }
    }
    if node is not None:
        allocation["nodeSelector"] = {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        }
    status: dict[str, Any] = {"allocation": allocation}
    if conditions is not None:
        status["devices"] = [
            {
                "driver": driver,
                "pool": pool,
                "device": device,
                "conditions": conditions,
                "data": data,
            }
        ]
    return {"metadata": {"uid": uid, "namespace": "ns", "name": f"c-{uid}"}, "status": status}


def ready(lease: int) -> dict[str, Any]:
    return {"conditions": [{"type": "RemoteGPUReady", "status": "True"}], "data": {"lease": lease}}


def alloc(uid: str, state: str = "", lease: int | None = None, **kw: Any) -> RemoteAlloc:
    base = dict(
        uid=uid, namespace="ns", name=f"c-{uid}", donor="node-a", device="gpu-0-remote",
        node="node-c", state=state, lease=lease,
    )  # fmt: skip
    return RemoteAlloc(**{**base, **kw})


def info(uid: str, lease: int, device: str = "gpu-0-remote", node: str = "node-c") -> LeaseInfo:
    return LeaseInfo(
        lease=lease, donor="donor-a", endpoint="h:1", instance="i1", claim_uid=uid, namespace="ns",
        name=f"c-{uid}", device=device, node=node,
    )  # fmt: skip


def listed(*items: LeaseInfo, instance: str = "i1") -> LeaseList:
    return LeaseList(instance=instance, items=list(items))


def test_remote_allocations_reads_state_and_skips_others() -> None:
    claims = [
        claim("new"),
        claim("ok", **ready(7)),
        claim("bad", conditions=[{"type": "RemoteGPUFailed", "status": "True"}]),
        claim("local", device="gpu-0", pool="node-a"),  # a local GPU of a lending pool
        claim("fabric", device="gpu-0-remote", pool="fabric/zone"),  # not a node's pool
        claim("other-driver", driver="other.example.com"),
        claim("no-node", node=None),
        {"metadata": {"uid": "unallocated"}, "status": {}},
    ]
    got = {a.uid: (a.state, a.lease) for a in remote_allocations(claims, DRIVER)}
    assert got == {"new": ("", None), "ok": ("ready", 7), "bad": ("failed", None)}
    # Whether a pod holds the claim: a lost lease is re-opened only then.
    held = claim("held", **ready(7))
    held["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "u"}]
    assert [a.reserved for a in remote_allocations([held, claim("ok")], DRIVER)] == [True, False]
    deleting = claim("gone")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert remote_allocations([deleting], DRIVER) == []


def test_plan_opens_new_allocations_and_keeps_ready_ones() -> None:
    a, b = alloc("a"), alloc("b", "ready", 5)
    assert plan([a, b], {"node-a": listed(info("b", 5))}) == [Open(a)]
    # A just-opened lease whose status is not written yet is kept, and opened again
    # (the donor answers the same lease).
    assert plan([a], {"node-a": listed(info("a", 9))}) == [Open(a)]


def test_plan_closes_leases_no_allocation_holds() -> None:
    failed = alloc("f", "failed")
    moved = alloc("m", device="gpu-1-remote")
    actions = plan(
        [failed, moved, alloc("r", "ready", 3)],
        {"node-a": listed(info("gone", 1), info("f", 2), info("m", 4), info("r", 3), info("r", 8))},
    )
    closes = {(a.lease, a.why) for a in actions if isinstance(a, Close)}
    assert closes == {
        (1, "claim gone or deallocated"),
        (2, "allocation failed"),
        (4, "claim allocated elsewhere"),
        (8, "superseded"),
    }
    # Closes come first: a claim's old lease blocks its new one at the donor.
    kinds = [type(a) for a in actions]
    assert kinds.index(Open) > max(i for i, k in enumerate(kinds) if k is Close)


def test_plan_keeps_one_lease_per_device_of_a_claim_with_several() -> None:
    devices = [f"gpu-{i}-remote" for i in range(3)]
    fresh = [alloc("s", device=d) for d in devices]
    assert plan(fresh, {"node-a": listed()}) == [Open(a) for a in fresh]
    ready = [alloc("s", "ready", 10 + i, device=d, instance="i1") for i, d in enumerate(devices)]
    held = listed(*(info("s", 10 + i, device=d) for i, d in enumerate(devices)))
    assert plan(ready, {"node-a": held}) == []
    # One device's lease lost in a donor restart: that device's is opened again, not
    # the others'.
    after = listed(
        info("s", 11, device=devices[1]), info("s", 12, device=devices[2]), instance="i2"
    )
    assert plan(ready, {"node-a": after}) == [Open(ready[0], reopen=True)]
    # The claim now holds two of them: the third's lease goes.
    closes = plan(ready[1:], {"node-a": held})
    assert closes == [Close("node-a", 10, "claim allocated elsewhere")]


def test_plan_reopens_a_ready_lease_its_donor_lost_but_judges_only_listed_donors() -> None:
    r = alloc("r", "ready", 3, instance="i1")
    # The donor restarted (another instance): the lease is opened again, for the same
    # claim, device and consumer (the allocation names this donor's device).
    assert plan([r], {"node-a": listed(instance="i2")}) == [Open(r, reopen=True)]
    # Once re-opened, the new lease is the claim's: nothing more to do.
    reopened = alloc("r", "ready", 1, instance="i2")
    assert plan([reopened], {"node-a": listed(info("r", 1), instance="i2")}) == []
    # No pod holds the claim any more (it is deallocated next): not re-opened.
    idle = alloc("r", "ready", 3, instance="i1", reserved=False)
    assert plan([idle], {"node-a": listed(instance="i2")}) == []
    # The same donor process closed it (the consumer's pod ended; the claim is
    # deallocated next): nothing to do.
    assert plan([r], {"node-a": listed(instance="i1")}) == []
    # An unreachable donor (not listed): nothing of its is judged.
    assert plan([r], {}) == []


def test_condition_entry_carries_no_credentials() -> None:
    a = alloc("a")
    data = {"donor": "node-a", "endpoint": "h:1", "lease": 5}
    entry = condition_entry(DRIVER, a, True, "LeaseOpen", "m", data)
    assert entry["conditions"][0]["type"] == "RemoteGPUReady"
    assert entry["data"] == data
    failed = condition_entry(DRIVER, a, False, "DonorUnreachable", "x" * 5000, None)
    assert failed["conditions"][0]["type"] == "RemoteGPUFailed"
    assert "data" not in failed and len(failed["conditions"][0]["message"]) == 1000


def test_with_retries_retries_only_retryable_errors() -> None:
    stop = threading.Event()
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise LeaseAPIError(Code.UNAVAILABLE, "down")
        return 42

    assert with_retries(flaky, 3, 0.001, stop) == 42 and len(calls) == 3

    def calls_failing_with(code: Code) -> int:
        def failing() -> int:
            calls.append(1)
            raise LeaseAPIError(code, "no")

        calls.clear()
        with pytest.raises(LeaseAPIError):
            with_retries(failing, 3, 0.001, stop)
        return len(calls)

    assert calls_failing_with(Code.FORBIDDEN) == 1
    assert calls_failing_with(Code.UNAVAILABLE) == 3


def test_lending_donors_are_the_node_pools_with_remote_devices() -> None:
    def sl(pool: str, *devices: str, driver: str = DRIVER) -> dict[str, Any]:
        return {
            "spec": {
                "driver": driver,
                "pool": {"name": pool},
                "devices": [{"name": d} for d in devices],
            }
        }

    slices = [
        sl("node-a", "gpu-0", "gpu-0-remote"),
        sl("node-b", "gpu-0"),  # does not lend
        sl("fab/zone", "gpu-9-remote"),  # a fabric pool
        sl("node-c", "gpu-0-remote", driver="other.example.com"),
        {"spec": {"driver": DRIVER, "pool": {"name": "node-d"}, "sharedCounters": []}},
    ]
    assert lending_donors(slices, DRIVER) == {"node-a"}


def test_merged_status_writes_a_claims_devices_together_and_keeps_its_others() -> None:
    def entry(device: str, lease: int, driver: str = DRIVER) -> dict[str, Any]:
        return {"driver": driver, "pool": "node-a", "device": device, **ready(lease)}

    current = [
        entry("gpu-0-remote", 1),  # ours, another device: kept
        entry("gpu-1-remote", 2),  # ours, written again now: replaced
        entry("gpu-5-remote", 3, driver="other.example.com"),  # not ours
        {"driver": DRIVER, "pool": "node-a", "device": "gpu-6-remote"},  # no condition of ours
    ]
    new = [entry("gpu-1-remote", 7), entry("gpu-2-remote", 8)]
    merged = merged_status(current, DRIVER, new)
    assert [(e["device"], e["data"]["lease"]) for e in merged] == [
        ("gpu-0-remote", 1),
        ("gpu-1-remote", 7),
        ("gpu-2-remote", 8),
    ]


def test_every_close_reason_is_exported_before_any_close() -> None:
    """A lease its consumer's plugin closed first is never closed by the controller: the
    counter's series must exist anyway, at 0, for the dashboard's rate()."""
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    for why in (
        "claim gone or deallocated",
        "claim allocated elsewhere",
        "allocation failed",
        "superseded",
    ):
        assert f'composable_dra_leases_closed_total{{why="{why}"}}' in text


def test_a_failed_reopen_is_a_lost_lease_and_a_failed_first_open_says_why() -> None:
    assert open_failure(retryable=True, reopen=False) == "DonorUnreachable"
    assert open_failure(retryable=False, reopen=False) == "LeaseRefused"
    assert open_failure(retryable=True, reopen=True) == "LeaseLost"
    assert open_failure(retryable=False, reopen=True) == "LeaseLost"
