"""The phases of the scaler's decision (device_scaler.decide), each on its own, and the
shared sizing rule (composable_dra.model.sizing) they use."""

from __future__ import annotations

from typing import Any

from api.v1alpha1 import ClaimRef, ComposabilityRequestSpec
from composable_dra.k8s.timestamps import format_time
from composable_dra.model import names
from composable_dra.model.names import ANN_EXPIRES, ANN_IN_USE_BY
from composable_dra.model.sizing import (
    ANN_LAST_USED,
    desired_size,
    last_used,
    least_recently_used,
    limits,
    spec_of,
)
from device_scaler.decide import decide
from device_scaler.decide.actions import DeleteResource, PatchResource, Unquarantine
from device_scaler.decide.attach import (
    Create,
    Failed,
    Ready,
    Settled,
    attach_progress,
    new_resource,
    settled,
)
from device_scaler.decide.claims import pending_claim
from device_scaler.decide.idle import IdleGPU, idle_bookkeeping
from device_scaler.decide.quarantines import expired_quarantines
from device_scaler.decide.release import allocation_ended
from device_scaler.decide.scale_down import scale_down
from device_scaler.decide.view import (
    Counts,
    Memo,
    block_holders,
    index,
    live_counts,
    local_users,
)
from tests.unit.device_scaler.test_scaler import CFG, NOW, POOL, claim, resource, snap

JSON = dict[str, Any]


def pc_of(c: JSON) -> Any:
    pc = pending_claim(c, names.DRIVER)
    assert pc is not None
    return pc


def specs(*crs: JSON) -> dict[str, Any]:
    return {cr["metadata"]["name"]: spec_of(cr) for cr in crs}


def request(**spec: Any) -> JSON:
    return {"spec": {"fabric": "fab", "model": "H100", "size": 1, **spec}}


class TestCounts:
    def test_add_returns_a_new_value_and_counts_per_node_or_cluster_wide(self) -> None:
        c = Counts({("fab", "a", "H100"): 1, ("fab", "b", "H100"): 2, ("fab", "a", "A100"): 5})
        more = c.add(("fab", "a", "H100"))
        assert c.count("fab", "a", "H100") == 1  # unchanged
        assert more.count("fab", "a", "H100") == 2
        assert more.count("fab", None, "H100") == 4
        assert more.add(("fab", "b", "H100"), -2).count("fab", None, "H100") == 2

    def test_only_live_resources_count(self) -> None:
        live = resource(claim_uid="c1", phase="Online", uuid="U")
        failed = resource(claim_uid="c2", device="gpu-2", phase="Failed")
        gone = resource(claim_uid="c3", device="gpu-3")
        gone["metadata"]["deletionTimestamp"] = format_time(NOW)
        counts = live_counts([live, failed, gone], specs(live, failed, gone))
        assert counts.by_key == {("fab", "node-a", "H100"): 1}

    def test_every_resource_but_a_detached_one_holds_its_block(self) -> None:
        held = resource(claim_uid="c1")
        done = resource(claim_uid="c2", device="gpu-2", phase="Detached")
        assert block_holders([held, done], specs(held, done)) == {
            ("fab", "gpu-1"): held["metadata"]["name"]
        }


class TestPendingAllocations:
    def test_a_pending_claim_names_its_node_and_pool_results(self) -> None:
        pc = pc_of(claim())
        assert pc.ref == ClaimRef("ns", "claim-c1", "c1")
        assert pc.node == "node-a" and pc.allocated_at == NOW - 5
        assert [r["device"] for r in pc.results] == ["gpu-1"]
        assert pending_claim(claim(binding=False), names.DRIVER) is None
        assert pending_claim(claim(allocated=False), names.DRIVER) is None

    def test_a_claim_whose_devices_all_say_ready_is_no_longer_pending(self) -> None:
        ready = {
            "driver": names.DRIVER,
            "pool": POOL,
            "device": "gpu-1",
            "conditions": [{"type": names.FABRIC_DEVICE_READY, "status": "True"}],
        }
        waiting = {**ready, "conditions": [{"type": names.FABRIC_DEVICE_READY, "status": "False"}]}
        memo = Memo(names.DRIVER)
        done, still, fresh = claim(uid="a"), claim(uid="b"), claim(uid="c")
        done["status"]["devices"] = [ready]
        still["status"]["devices"] = [waiting]
        facts = {f.uid: f for f in memo.claims([done, still, fresh])}
        assert facts["a"].pending is None and facts["a"].results  # still its local user
        assert facts["b"].pending is not None and facts["c"].pending is not None
        assert decide(snap([done]), CFG) == []

    def test_a_failed_entry_is_kept_and_its_resource_doomed(self) -> None:
        entry = {
            "driver": names.DRIVER,
            "pool": POOL,
            "device": "gpu-1",
            "conditions": [{"type": names.FABRIC_DEVICE_FAILED, "status": "True"}],
            "extra": "dropped",
        }
        s = settled(entry, pc_of(claim()), POOL, "gpu-1")
        assert isinstance(s, Settled) and s.doomed is not None and "extra" not in s.entry
        ready = {**entry, "conditions": [{"type": names.FABRIC_DEVICE_READY, "status": "True"}]}
        s = settled(ready, pc_of(claim()), POOL, "gpu-1")
        assert isinstance(s, Settled) and s.doomed is None
        assert settled(None, pc_of(claim()), POOL, "gpu-1") is None

    def test_a_new_resource_is_created_for_the_allocations_node(self) -> None:
        view = index(snap([claim()]), CFG)
        step = new_resource(view, Counts(), pc_of(claim()), POOL, "gpu-1")
        assert isinstance(step, Create) and step.key == ("fab", "node-a", "H100")
        assert step.action.body["spec"]["targetNode"] == "node-a"

    def test_a_new_resource_is_refused_at_max_size_or_when_the_block_is_held(self) -> None:
        view = index(snap([claim()], requests=[request(targetNode="node-a", maxSize=1)]), CFG)
        full = Counts({("fab", "node-a", "H100"): 1})
        step = new_resource(view, full, pc_of(claim()), POOL, "gpu-1")
        assert isinstance(step, Failed) and step.reason == "MaxSizeReached"
        other = resource(claim_uid="c0")
        view = index(snap([claim()], [other]), CFG)
        step = new_resource(view, Counts(), pc_of(claim(uid="c9")), POOL, "gpu-1")
        assert isinstance(step, Failed) and step.reason == "DeviceInUse"

    def test_progress_is_ready_failed_or_nothing_yet(self) -> None:
        online = resource(phase="Online", uuid="U-1")
        step = attach_progress(index(snap(), CFG), online, pc_of(claim()), POOL, "gpu-1")
        assert isinstance(step, Ready) and step.entry["data"] == {"uuid": "U-1"}
        assert step.since == 5.0
        late = resource(age=61)
        step = attach_progress(index(snap(), CFG), late, pc_of(claim()), POOL, "gpu-1")
        assert isinstance(step, Failed) and step.reason == "AttachTimeout"
        assert (
            attach_progress(index(snap(), CFG), resource(), pc_of(claim()), POOL, "gpu-1") is None
        )


class TestEndedAllocations:
    def ref(self) -> ClaimRef:
        return ClaimRef("ns", "claim-c1", "c1")

    def test_nothing_while_the_allocation_lasts(self) -> None:
        cr = resource(phase="Online", uuid="U")
        by_uid = {"c1": claim()}
        assert allocation_ended(index(snap(), CFG), cr, self.ref(), by_uid) is None

    def test_released_once_the_pool_dropped_it_and_deleted_if_never_online(self) -> None:
        online = resource(phase="Online", uuid="U")
        assert allocation_ended(index(snap(), CFG), online, self.ref(), {}) is None  # in pool
        p = allocation_ended(index(snap(pool=()), CFG), online, self.ref(), {})
        assert isinstance(p, PatchResource) and p.reason == "Released"
        d = allocation_ended(index(snap(), CFG), resource(), self.ref(), {})
        assert isinstance(d, DeleteResource) and d.reason == "AllocationEnded"

    def test_the_first_claim_naming_a_local_device_is_its_user(self) -> None:
        a = claim(uid="a", device="local-1", pool="node-a", binding=False)
        b = claim(uid="b", device="local-1", pool="node-a", binding=False)
        assert local_users(Memo(names.DRIVER).claims([a, b])) == {("node-a", "local-1"): "a"}

    def test_idle_bookkeeping_marks_in_use_marks_idle_or_counts_idle(self) -> None:
        cr = resource(claim_uid=None, phase="Online", uuid="U-1")
        spec = spec_of(cr)
        assert spec is not None
        view = index(snap(local={("node-a", "u-1"): "local-1"}), CFG)
        step = idle_bookkeeping(view, cr, spec, {("node-a", "local-1"): "c9"})
        assert isinstance(step, PatchResource) and step.reason == "InUse"
        cr["metadata"]["annotations"][ANN_IN_USE_BY] = "c9"
        step = idle_bookkeeping(view, cr, spec, {})
        assert isinstance(step, PatchResource) and step.reason == "Idle"
        del cr["metadata"]["annotations"][ANN_IN_USE_BY]
        step = idle_bookkeeping(view, cr, spec, {})
        assert isinstance(step, IdleGPU) and step.last_used == NOW - 5


class TestScaleDown:
    def gpu(self, name: str, last: float) -> IdleGPU:
        cr = resource(claim_uid=None, phase="Online", uuid=name, name=name)
        spec = spec_of(cr)
        assert spec is not None
        return IdleGPU(last, cr, spec)

    def test_expired_ones_go_least_recently_used_first_down_to_min(self) -> None:
        gpus = [self.gpu("new", NOW - 200), self.gpu("old", NOW - 900), self.gpu("mid", NOW - 500)]
        counts = Counts({("fab", "node-a", "H100"): 3})
        view = index(snap(requests=[request(targetNode="node-a", size=2, minSize=1)]), CFG)
        # last_used reads the resource: stamp what the test means.
        for g in gpus:
            g.cr["metadata"]["annotations"][ANN_LAST_USED] = format_time(g.last_used)
        deletes = scale_down(view, counts, gpus)
        assert [d.name for d in deletes if isinstance(d, DeleteResource)] == ["old", "mid"]

    def test_quarantines_without_a_future_expiry_end(self) -> None:
        rules = [
            {"metadata": {"name": "past", "annotations": {ANN_EXPIRES: format_time(NOW - 1)}}},
            {"metadata": {"name": "future", "annotations": {ANN_EXPIRES: format_time(NOW + 1)}}},
            {"metadata": {"name": "unreadable", "annotations": {ANN_EXPIRES: "x"}}},
        ]
        assert expired_quarantines(rules, NOW) == [Unquarantine("past"), Unquarantine("unreadable")]


class TestSizing:
    def cr(self, name: str, **status: str) -> JSON:
        return {
            "metadata": {"name": name, "creationTimestamp": format_time(NOW - 100)},
            "status": status,
        }

    def test_last_used_prefers_the_scalers_stamp_then_status_then_attach_then_creation(
        self,
    ) -> None:
        cr = self.cr("a", lastUsedAt=format_time(NOW - 3), attachedAt=format_time(NOW - 50))
        assert last_used(cr, NOW) == NOW - 3
        cr["metadata"]["annotations"] = {ANN_LAST_USED: format_time(NOW - 1)}
        assert last_used(cr, NOW) == NOW - 1
        assert last_used(self.cr("b", attachedAt=format_time(NOW - 50)), NOW) == NOW - 50
        assert last_used(self.cr("c"), NOW) == NOW - 100
        assert last_used({"metadata": {"name": "d"}}, NOW) == NOW

    def test_least_recently_used_first_and_the_name_breaks_a_tie(self) -> None:
        same = format_time(NOW - 10)
        crs = [
            self.cr("z", lastUsedAt=same),
            self.cr("late", lastUsedAt=format_time(NOW - 1)),
            self.cr("a", lastUsedAt=same),
        ]
        assert [c["metadata"]["name"] for c in least_recently_used(crs, NOW)] == ["a", "z", "late"]

    def test_size_is_clamped_and_limits_combine_matching_requests(self) -> None:
        spec = ComposabilityRequestSpec.model_validate(
            {"fabric": "f", "model": "m", "size": 5, "maxSize": 3}
        )
        assert desired_size(spec) == 3
        reqs = [
            request(targetNode="n", minSize=1, maxSize=4),
            request(targetNode="n", minSize=2, maxSize=3),
            request(minSize=7),  # cluster-wide: not the node's
            request(targetNode="n", model="A100", maxSize=0),
        ]
        lim = limits(reqs, "fab", "H100", "n")
        assert (lim.min_size, lim.max_size) == (2, 3)
        assert limits(reqs, "fab", "H100", None).min_size == 7
