"""The Dynamic Device Scaler's decisions (device_scaler.decide), one situation at a time."""

from __future__ import annotations

from typing import Any

from api.v1alpha1 import ClaimRef
from composable_dra.k8s.timestamps import format_time
from composable_dra.model import names
from composable_dra.model.names import ANN_IN_USE_BY, ANN_POOL, ANN_POOL_DEVICE
from device_scaler.decide import (
    ANN_LAST_USED,
    ScalerSettings,
    ScalerSnapshot,
    allocation_node,
    decide,
    resource_body,
    resource_name,
)
from device_scaler.decide import actions as action
from testbed.objects import as_scheduler_claim

DRIVER = names.DRIVER
NOW = 1_800_000_000.0
POOL = "fab/zone-1"
CFG = ScalerSettings(attach_timeout=60, no_removal=100, quarantine=30)
JSON = dict[str, Any]


def pool_device(name: str = "gpu-1", model: str = "H100") -> JSON:
    return {
        "name": name,
        "attributes": {
            "fabric": {"string": "fab"},
            "blockID": {"string": name},
            "model": {"string": model},
        },
    }


def claim(
    uid: str = "c1",
    device: str = "gpu-1",
    node: str = "node-a",
    status_devices: list[JSON] | None = None,
    allocated: bool = True,
    pool: str = POOL,
    binding: bool = True,
) -> JSON:
    result: JSON = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}
    if binding:
        result["bindingConditions"] = [names.FABRIC_DEVICE_READY]
        result["bindingFailureConditions"] = [names.FABRIC_DEVICE_FAILED]
    status: JSON = {}
    if allocated:
        status["allocation"] = {
            "devices": {"results": [result]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
            "allocationTimestamp": format_time(NOW - 5),
        }
    if status_devices is not None:
        status["devices"] = status_devices
    return {"metadata": {"name": f"claim-{uid}", "namespace": "ns", "uid": uid}, "status": status}


def resource(
    claim_uid: str | None = "c1",
    device: str = "gpu-1",
    phase: str | None = "Attaching",
    node: str = "node-a",
    age: float = 5,
    uuid: str | None = None,
    annotations: JSON | None = None,
    conditions: list[JSON] | None = None,
    name: str | None = None,
) -> JSON:
    ref = ClaimRef("ns", f"claim-{claim_uid}", claim_uid or "x")
    body = resource_body(
        name or resource_name(claim_uid or "x", POOL, device),
        ref,
        POOL,
        device,
        "fab",
        device,
        "H100",
        node,
    )
    if claim_uid is None:
        del body["spec"]["claimRef"]
    body["metadata"]["creationTimestamp"] = format_time(NOW - age)
    body["metadata"]["annotations"].update(annotations or {})
    body["status"] = {"phase": phase, "conditions": conditions or []}
    if uuid:
        body["status"]["deviceUUID"] = uuid
    return body


def snap(
    claims: list[JSON] = (),  # type: ignore[assignment]
    resources: list[JSON] = (),  # type: ignore[assignment]
    pool: tuple[str, ...] = ("gpu-1", "gpu-2"),
    local: dict[tuple[str, str], str] | None = None,
    requests: list[JSON] | None = None,
    quarantines: list[JSON] | None = None,
    now: float = NOW,
) -> ScalerSnapshot:
    return ScalerSnapshot(
        now=now,
        claims=list(claims),
        resources=list(resources),
        pool_devices={(POOL, d): pool_device(d) for d in pool},
        local_devices=local or {},
        requests=requests or [],
        quarantines=quarantines or [],
    )


def run(s: ScalerSnapshot, cfg: ScalerSettings = CFG) -> list[Any]:
    return list(decide(s, cfg))


def only(actions: list[Any], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def test_names_are_deterministic_dns_subdomains():
    a = resource_name("uid-1", POOL, "gpu-1")
    assert a == resource_name("uid-1", POOL, "gpu-1")
    assert a != resource_name("uid-2", POOL, "gpu-1")
    assert a.startswith("gpu-1-") and len(a) <= 63


def test_allocation_node_from_match_fields_or_hostname():
    assert allocation_node(claim()["status"]["allocation"]) == "node-a"
    sel = {
        "nodeSelector": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n"]}
                    ]
                }
            ]
        }
    }
    assert allocation_node(sel) == "n"
    assert allocation_node({}) is None


def test_a_pending_pool_allocation_gets_a_resource():
    [a] = run(snap([claim()]), CFG)
    assert isinstance(a, action.CreateResource)
    spec = a.body["spec"]
    assert spec == {
        "fabric": "fab",
        "deviceID": "gpu-1",
        "targetNode": "node-a",
        "model": "H100",
        "claimRef": {"namespace": "ns", "name": "claim-c1", "uid": "c1"},
    }
    assert a.body["metadata"]["annotations"] == {ANN_POOL: POOL, ANN_POOL_DEVICE: "gpu-1"}


def test_local_and_unconditioned_allocations_are_not_ours_to_attach():
    assert run(snap([claim(pool="node-a", binding=False)]), CFG) == []
    assert run(snap([claim(allocated=False)]), CFG) == []


def test_attaching_resource_waits():
    assert run(snap([claim()], [resource()]), CFG) == []


def test_online_resource_makes_the_claim_ready_with_the_uuid():
    actions = run(snap([claim()], [resource(phase="Online", uuid="U-1")]), CFG)
    [a] = only(actions, action.SetDeviceStatus)
    [entry] = a.entries
    assert (entry["driver"], entry["pool"], entry["device"]) == (DRIVER, POOL, "gpu-1")
    assert entry["data"] == {"uuid": "U-1"}
    [cond] = entry["conditions"]
    assert (cond["type"], cond["status"]) == (names.FABRIC_DEVICE_READY, "True")
    assert cond["reason"] and cond["lastTransitionTime"]
    assert a.ready == [("gpu-1", 5.0)]
    # Once written, nothing more to do.
    done = claim(status_devices=[entry])
    assert run(snap([done], [resource(phase="Online", uuid="U-1")]), CFG) == []


def failed_cases() -> list[tuple[JSON, str]]:
    fabric_failed = {
        "type": names.ATTACHED,
        "status": "False",
        "reason": "FabricFailed",
        "message": "task failed",
    }
    return [
        (resource(phase="Failed"), "AttachFailed"),
        (resource(conditions=[fabric_failed]), "FabricOperationFailed"),
        (resource(age=61), "AttachTimeout"),
    ]


def test_failure_sets_failed_quarantines_and_deletes():
    for cr, reason in failed_cases():
        actions = run(snap([claim()], [cr]), CFG)
        kinds = [type(a) for a in actions]
        assert kinds == [action.Quarantine, action.SetDeviceStatus, action.DeleteResource], reason
        q, st, d = actions
        assert (q.pool, q.device, q.until) == (POOL, "gpu-1", NOW + 30)
        [cond] = st.entries[0]["conditions"]
        assert (cond["type"], cond["reason"]) == (names.FABRIC_DEVICE_FAILED, reason)
        assert d.name == cr["metadata"]["name"]


def test_fabric_error_waits_when_fail_fast_is_off():
    cfg = ScalerSettings(attach_timeout=60, fail_on_fabric_error=False)
    cr = failed_cases()[1][0]
    assert run(snap([claim()], [cr]), cfg) == []


def test_a_failed_entry_still_gets_its_resource_deleted_after_a_crash():
    failed = {
        "driver": DRIVER,
        "pool": POOL,
        "device": "gpu-1",
        "conditions": [{"type": names.FABRIC_DEVICE_FAILED, "status": "True"}],
    }
    actions = run(snap([claim(status_devices=[failed])], [resource()]), CFG)
    assert [type(a) for a in actions] == [action.DeleteResource]


def test_max_size_refuses_an_attach():
    req = {
        "spec": {"fabric": "fab", "model": "H100", "targetNode": "node-a", "size": 1, "maxSize": 1}
    }
    other = resource(claim_uid="c0", device="gpu-2", phase="Online", uuid="U-2")
    actions = run(snap([claim()], [other], requests=[req]), CFG)
    [st] = only(actions, action.SetDeviceStatus)
    assert st.failed[0][1] == "MaxSizeReached"
    assert not only(actions, action.CreateResource)


def test_release_waits_for_the_pool_to_drop_the_device_then_clears_the_claim_ref():
    online = resource(phase="Online", uuid="U-1")
    # The claim is gone, but the pool still lists gpu-1: wait (published exactly once).
    assert run(snap([], [online]), CFG) == []
    [p] = run(snap([], [online], pool=("gpu-2",)), CFG)
    assert isinstance(p, action.PatchResource) and p.reason == "Released"
    assert p.patch["spec"] == {"claimRef": None}
    assert p.patch["metadata"]["annotations"][ANN_LAST_USED] == format_time(NOW)


def test_allocation_ended_before_online_deletes():
    [d] = run(snap([], [resource(phase="Attaching")], pool=()), CFG)
    assert isinstance(d, action.DeleteResource) and d.reason == "AllocationEnded"


def idle(
    name: str, last: float, node: str = "node-a", uuid: str = "u", ann: JSON | None = None
) -> JSON:
    return resource(
        claim_uid=None,
        phase="Online",
        uuid=uuid,
        node=node,
        name=name,
        annotations={ANN_LAST_USED: format_time(last), **(ann or {})},
    )


def test_idle_gpu_reused_as_local_device_is_marked_in_use_and_not_detached():
    cr = idle("r1", NOW - 1000, uuid="U-1")
    user = claim(uid="c9", device="gpu-u-1", pool="node-a", binding=False)
    local = {("node-a", "u-1"): "gpu-u-1"}
    [p] = run(snap([user], [cr], local=local), CFG)
    assert isinstance(p, action.PatchResource) and p.patch["metadata"]["annotations"] == {
        ANN_IN_USE_BY: "c9"
    }
    marked = idle("r1", NOW - 1000, uuid="U-1", ann={ANN_IN_USE_BY: "c9"})
    assert run(snap([user], [marked], local=local), CFG) == []
    # Released again: the idle window starts now, not at the old last-used.
    [p] = run(snap([], [marked], local=local), CFG)
    assert p.reason == "Idle" and p.patch["metadata"]["annotations"][ANN_LAST_USED] == format_time(
        NOW
    )


def test_idle_detach_after_the_window_least_recently_used_first_honouring_min():
    a = idle("a", NOW - 500)
    b = idle("b", NOW - 300)
    c = idle("c", NOW - 50)  # within the window
    [d1, d2] = run(snap([], [c, b, a]), CFG)
    assert [d1.name, d2.name] == ["a", "b"] and d1.reason == "IdleTimeout"
    req = {
        "spec": {"fabric": "fab", "model": "H100", "targetNode": "node-a", "size": 2, "minSize": 2}
    }
    [d] = run(snap([], [c, b, a], requests=[req]), CFG)
    assert d.name == "a"


def test_over_max_idle_ones_go_even_within_the_window():
    a, b = idle("a", NOW - 20), idle("b", NOW - 10)
    req = {
        "spec": {"fabric": "fab", "model": "H100", "targetNode": "node-a", "size": 1, "maxSize": 1}
    }
    [d] = run(snap([], [a, b], requests=[req]), CFG)
    assert (d.name, d.reason) == ("a", "OverMaxSize")


def test_quarantines_expire():
    rules = [
        {
            "metadata": {
                "name": "q1",
                "annotations": {"composable.dra.io/expires-at": format_time(NOW - 1)},
            }
        },
        {
            "metadata": {
                "name": "q2",
                "annotations": {"composable.dra.io/expires-at": format_time(NOW + 9)},
            }
        },
    ]
    assert run(snap(quarantines=rules), CFG) == [action.Unquarantine("q1")]


def test_a_block_another_resource_holds_is_never_attached_twice():
    idle_gpu1 = idle("old", NOW - 5)  # released, attached, gpu-1
    actions = run(snap([claim(uid="c2")], [idle_gpu1]))
    assert not only(actions, action.CreateResource)
    [st] = only(actions, action.SetDeviceStatus)
    assert st.failed[0][1] == "DeviceInUse"


class SlicesKube:
    """The API server's answer to the scaler's consistent read of the pools."""

    def __init__(self, devices: list[str] | None) -> None:
        self.devices, self.queries = devices, []  # type: ignore[var-annotated]

    def get(self, url: str, **query: Any) -> JSON:
        from composable_dra.k8s.kube import KubeError

        self.queries.append(query)
        if self.devices is None:
            raise KubeError(503, "ServiceUnavailable", "API server unreachable")
        return {
            "items": [
                {"spec": {"pool": {"name": POOL}, "devices": [{"name": d} for d in self.devices]}}
            ]
        }


def test_a_release_waits_until_a_consistent_read_shows_the_pool_dropped_the_device():
    from device_scaler.scaler import Scaler, ScalerConfig

    # The slice cache no longer shows gpu-1, so decide releases it; the API server still
    # has it in the pool (the cache caught the pool between two slices, or lags): wait.
    online = resource(phase="Online", uuid="U-1")
    s = snap([], [online], pool=("gpu-2",))
    actions = run(s)
    assert [a.reason for a in only(actions, action.PatchResource)] == ["Released"]
    kube = SlicesKube(["gpu-1", "gpu-2"])
    scaler = Scaler(kube, ScalerConfig(CFG))  # type: ignore[arg-type]  # not started
    try:
        assert scaler._confirm_releases(actions, s) == []
        assert kube.queries[0]["labelSelector"] == "composable.dra.io/managed-by=pool-publisher"
        kube.devices = None  # unknown: no release either
        assert scaler._confirm_releases(actions, s) == []
        kube.devices = ["gpu-2"]
        assert scaler._confirm_releases(actions, s) == actions
    finally:
        scaler.stop()


def test_remote_lease_allocations_are_not_the_scalers_to_attach():
    lent = claim(pool="node-d", device="gpu-0-remote", binding=False)
    (result,) = lent["status"]["allocation"]["devices"]["results"]
    result["bindingConditions"] = ["RemoteGPUReady"]
    result["bindingFailureConditions"] = ["RemoteGPUFailed"]
    assert run(snap([lent]), CFG) == []


def test_snapshot_reads_a_lending_nodes_pool():
    from device_scaler.scaler import Scaler, ScalerConfig
    from dra_driver.device_source import DeviceInfo
    from dra_driver.slices import LendPolicy, desired_slices

    # Per-device node selection: the GPU is node-a's local device (idle bookkeeping finds
    # it), its remote-lease device is nobody's pool device.
    gpu = DeviceInfo(name="gpu-0", uuid="GPU-U-1", model="H100")
    attached = DeviceInfo(name="gpu-1", uuid="GPU-U-2", model="H100", attachment="fabric")
    policy = LendPolicy(network_domain="rack-1", link_gbps=100, max_leases=2)
    slices = desired_slices("node-a", "uid-a", DRIVER, [gpu, attached], 1, lend=policy)
    scaler = Scaler(SlicesKube([]), ScalerConfig(CFG))  # type: ignore[arg-type]  # not started
    try:
        scaler.slices.items = lambda: slices  # type: ignore[method-assign]
        s = scaler.snapshot()
    finally:
        scaler.stop()
    assert s.local_devices == {("node-a", "u-1"): "gpu-0", ("node-a", "u-2"): "gpu-1"}
    assert s.pool_devices == {}


def test_the_slice_cache_keeps_of_a_nodes_own_slice_only_which_gpu_has_which_uuid():
    from device_scaler.scaler import Scaler, ScalerConfig
    from dra_driver.device_source import DeviceInfo
    from dra_driver.slices import LendPolicy, desired_slices

    gpus = [DeviceInfo(name=f"gpu-{k}", uuid=f"GPU-N-{k}", model="H100") for k in range(3)]
    own = desired_slices("node-a", "uid-a", DRIVER, gpus, 1)
    lending = desired_slices(
        "node-b",
        "uid-b",
        DRIVER,
        [DeviceInfo(name="gpu-0", uuid="GPU-L-0", model="H100")],
        1,
        lend=LendPolicy(network_domain="rack-1", link_gbps=100, max_leases=2),
    )
    pool = {
        "metadata": {"name": "fab-z1-0"},
        "spec": {
            "driver": DRIVER,
            "pool": {"name": "fab/z1", "generation": 1, "resourceSliceCount": 1},
            "nodeSelector": {"nodeSelectorTerms": []},
            "devices": [{"name": "gpu-9", "attributes": {"model": {"string": "H100"}}}],
        },
    }
    every = [*own, *lending, pool]
    scaler = Scaler(SlicesKube([]), ScalerConfig(CFG))  # type: ignore[arg-type]  # not started
    try:
        whole = scaler.snapshot(slices=every)
        scaler.slices.replace(every)
        kept = scaler.snapshot()
        cached = {s["metadata"]["name"]: s for s in scaler.slices.items()}
    finally:
        scaler.stop()
    assert kept.local_devices == whole.local_devices and len(kept.local_devices) == 4
    assert kept.pool_devices == whole.pool_devices
    [own_kept] = [cached[s["metadata"]["name"]] for s in own]
    assert set(own_kept["spec"]["devices"][0]) == {"name", "attributes"}
    assert set(own_kept["spec"]["devices"][0]["attributes"]) == {"uuid"}
    others = [s for s in every if not s["spec"].get("nodeName")]  # per-device, pool: whole
    assert len(others) == 2
    for other in others:
        assert cached[other["metadata"]["name"]]["spec"] == other["spec"]


def test_a_claim_the_scheduler_made_for_an_extended_resource_gets_its_gpu_attached():
    """kube-scheduler's claim for a pod's extended resource (generated name, the pod as
    owner, a request named after the container) is attached for like any claim: the
    resource's claimRef names it, and the claim gets FabricDeviceReady."""
    made = as_scheduler_claim(claim())
    [a] = run(snap([made]), CFG)
    assert isinstance(a, action.CreateResource)
    assert a.body["spec"]["claimRef"] == {
        "namespace": "ns",
        "name": "trainer-extended-resources-x7k2p",
        "uid": "c1",
    }
    cr = resource(phase="Online", uuid="U-1", name=a.body["metadata"]["name"])
    cr["spec"]["claimRef"] = a.body["spec"]["claimRef"]
    [ready] = only(run(snap([made], [cr]), CFG), action.SetDeviceStatus)
    assert [c["type"] for c in ready.entries[0]["conditions"]] == [names.FABRIC_DEVICE_READY]


def test_the_idle_rule_counts_a_claim_the_scheduler_made_for_an_extended_resource():
    cr = idle("r1", NOW - 1000, uuid="U-1")
    user = as_scheduler_claim(claim(uid="c9", device="gpu-u-1", pool="node-a", binding=False))
    local = {("node-a", "u-1"): "gpu-u-1"}
    [p] = run(snap([user], [cr], local=local), CFG)
    assert isinstance(p, action.PatchResource) and p.reason == "InUse"
    assert p.patch["metadata"]["annotations"] == {ANN_IN_USE_BY: "c9"}


class RecordingKube(SlicesKube):
    """Records every write the scaler sends."""

    def __init__(self) -> None:
        super().__init__([])
        self.writes: list[tuple[str, str]] = []

    def create(self, url: str, body: JSON) -> JSON:
        self.writes.append(("create", url))
        return body


def test_without_device_taint_rules_nothing_is_watched_or_written_for_quarantines():
    from device_scaler.scaler import Scaler, ScalerConfig

    # v1.35 and v1.36 serve no resource.k8s.io/v1 DeviceTaintRules: a watch of them would
    # only answer 404, and the first pass waits for every informer's first list.
    kube = RecordingKube()
    scaler = Scaler(kube, ScalerConfig(CFG, taint_rules=False))  # type: ignore[arg-type]
    try:
        assert scaler.quarantines not in scaler.informers
        scaler._do(action.Quarantine(POOL, "gpu-1", 0.0))
        assert kube.writes == []
    finally:
        scaler.stop()
    served = Scaler(RecordingKube(), ScalerConfig(CFG))  # type: ignore[arg-type]
    try:
        assert served.quarantines in served.informers
        served._do(action.Quarantine(POOL, "gpu-1", 0.0))
        assert served.kube.writes == [  # type: ignore[attr-defined]
            ("create", "/apis/resource.k8s.io/v1/devicetaintrules")
        ]
    finally:
        served.stop()
