"""The scaler's writes that its caches do not show yet (device_scaler/unseen.py), and the
passes that send a claim's resource and FabricDeviceReady without waiting for them."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from composable_dra.k8s.kube import Conflict
from composable_dra.model import names
from device_scaler.decide import (
    CreateResource,
    DeleteResource,
    Quarantine,
    SetDeviceStatus,
    decide,
    resource_name,
)
from device_scaler.unseen import Unseen, hold_back
from tests.unit.device_scaler.test_scaler import CFG, NOW, POOL, claim, pool_device, resource, snap

JSON = dict[str, Any]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def create_of(uid: str = "c1") -> CreateResource:
    (action,) = [a for a in decide(snap([claim(uid=uid)]), CFG) if isinstance(a, CreateResource)]
    return action


def ready_of(uid: str = "c1") -> SetDeviceStatus:
    online = resource(claim_uid=uid, phase="Online", uuid="U-1")
    actions = decide(snap([claim(uid=uid)], [online]), CFG)
    (action,) = [a for a in actions if isinstance(a, SetDeviceStatus)]
    return action


def test_the_resources_carry_the_operators_finalizer_from_the_start():
    # The operator sends no attach before its finalizer is on: set at creation, kopf
    # has nothing to add (a write and a watch round trip on every attach's path).
    assert create_of().body["metadata"]["finalizers"] == [names.FINALIZER]


def test_a_create_is_not_sent_again_until_the_cache_shows_it_or_it_settles():
    clock = Clock()
    unseen = Unseen(clock, settle=10)
    create = create_of()
    assert not unseen.pending(create)
    unseen.sent(create)
    unseen.forget_seen(lambda name: False, lambda key: None)
    assert unseen.pending(create)
    # The watch brings it: decided from the cache from now on.
    unseen.forget_seen(lambda name: name == create.name, lambda key: None)
    assert not unseen.pending(create)
    # A watch that lost it: after the settle time the create is decided again.
    unseen.sent(create)
    clock.now += 10
    unseen.forget_seen(lambda name: False, lambda key: None)
    assert not unseen.pending(create)
    # A failed write is decided again at once.
    unseen.sent(create)
    unseen.failed(create)
    assert not unseen.pending(create)


def test_a_status_write_waits_for_the_claim_to_move_past_the_version_it_was_decided_on():
    unseen = Unseen(Clock())
    ready = ready_of()
    unseen.sent(replace(ready, version="7"))
    unseen.forget_seen(lambda name: False, lambda key: "7")
    assert unseen.pending(ready)
    unseen.forget_seen(lambda name: False, lambda key: "8")
    assert not unseen.pending(ready)
    unseen.sent(replace(ready, version="8"))
    unseen.forget_seen(lambda name: False, lambda key: None)  # the claim is gone
    assert not unseen.pending(ready)


def test_a_claims_deletes_wait_behind_its_held_back_status_write():
    unseen = Unseen(Clock())
    ready = ready_of("c1")
    unseen.sent(replace(ready, version="7"))
    # The same claim now fails (its resource went away) while the Ready write is not yet
    # in the cache; another claim's delete is not held.
    failed = SetDeviceStatus(ready.claim, [], failed=[("gpu-1", "ResourceDeleted", "")])
    mine = resource_name("c1", POOL, "gpu-1")
    other = resource_name("c2", POOL, "gpu-1")
    quarantine = Quarantine(POOL, "gpu-1", NOW + 30)
    actions = [quarantine, failed, DeleteResource(mine, "x"), DeleteResource(other, "x")]
    owner = {mine: "c1", other: "c2"}
    kept = hold_back(actions, unseen, owner.get)
    assert kept == [quarantine, DeleteResource(other, "x")]


class SlowKube:
    """Creates block until released; counts them."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.creates: list[str] = []
        self.lock = threading.Lock()

    def create(self, url: str, body: JSON) -> JSON:
        with self.lock:
            self.creates.append(body["metadata"]["name"])
            first = self.creates.count(body["metadata"]["name"]) == 1
        self.release.wait(10)
        if not first:
            raise Conflict(409, "AlreadyExists", "exists")
        return body

    def get(self, url: str, **query: Any) -> JSON:
        return {"items": []}


def test_a_pass_sends_a_claims_resource_without_waiting_and_a_later_pass_not_again():
    from device_scaler.scaler import Scaler, ScalerConfig

    kube = SlowKube()
    scaler = Scaler(kube, ScalerConfig(CFG))  # type: ignore[arg-type]  # not started
    scaler._claim_event = lambda *a, **k: None  # type: ignore[method-assign]
    c = claim()
    scaler.claims.items = lambda: [c]  # type: ignore[method-assign]
    scaler.slices.items = lambda: [  # type: ignore[method-assign]
        {"spec": {"pool": {"name": POOL}, "devices": [pool_device("gpu-1")]}}
    ]
    try:
        passes = threading.Thread(target=lambda: [scaler.reconcile() for _ in range(2)])
        passes.start()
        # Both passes end while the create is still on its way (the resource is not in
        # the cache yet), and the second does not send it again.
        passes.join(5)
        assert not passes.is_alive()
        assert kube.creates == [resource_name("c1", POOL, "gpu-1")]
    finally:
        kube.release.set()
        passes.join(10)
        scaler.wait_sent(10)
        scaler.stop()


def test_a_status_write_carries_the_version_of_the_claim_it_was_decided_on():
    online = resource(claim_uid="c1", phase="Online", uuid="U-1")
    versioned = claim(uid="c1")
    versioned["metadata"]["resourceVersion"] = "42"
    (action,) = [
        a for a in decide(snap([versioned], [online]), CFG) if isinstance(a, SetDeviceStatus)
    ]
    assert action.version == "42"
    unseen = Unseen(Clock())
    unseen.sent(action)
    unseen.forget_seen(lambda name: False, lambda key: "42")
    assert unseen.pending(action)  # the cache still shows the claim it was decided on
