"""Warm standby (device_scaler/standby.py): sizing, placement, the plan, and the scaler's
standby phase in ``decide``."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api.v1alpha1 import FabricSpec, StandbyPolicy
from composable_dra.k8s.timestamps import format_time
from composable_dra.model import names
from composable_dra.model.names import ANN_EXPIRES, ANN_IN_USE_BY, ANN_POOL, ANN_POOL_DEVICE
from device_scaler import standby as sb
from device_scaler.decide import (
    CreateResource,
    DeleteResource,
    Quarantine,
    ScalerSnapshot,
    decide,
)
from device_scaler.scaler import standby_held
from tests.unit.device_scaler.test_scaler import CFG, NOW, POOL, claim, idle, pool_device, resource

JSON = dict[str, Any]
NODES = ("node-a", "node-b", "node-c")


def policy(**kw: Any) -> StandbyPolicy:
    return StandbyPolicy.model_validate(
        {"maxPerZone": 4, "windowSeconds": 60, "attachSeconds": 30, **kw}
    )


# -- sizing ------------------------------------------------------------------------------


def test_size_is_arrivals_times_attach_time_over_the_window():
    p = policy()
    assert sb.standby_size(0, p) == 0
    assert sb.standby_size(1, p) == 1  # rounded up: half a claim per attach is one GPU
    assert sb.standby_size(4, p) == 2
    assert sb.standby_size(100, p) == 4  # clamped to maxPerZone
    assert sb.standby_size(0, policy(minPerZone=2)) == 2
    assert sb.standby_size(50, None) == 0


@settings(max_examples=400)
@given(
    arrivals=st.integers(min_value=-5, max_value=100_000),
    lo=st.integers(min_value=0, max_value=1024),
    hi=st.integers(min_value=0, max_value=1024),
    window=st.integers(min_value=10, max_value=86400),
    attach=st.integers(min_value=1, max_value=3600),
)
def test_size_never_above_max_never_below_min_zero_when_disabled(
    arrivals: int, lo: int, hi: int, window: int, attach: int
) -> None:
    lo, hi = min(lo, hi), max(lo, hi)
    p = policy(minPerZone=lo, maxPerZone=hi, windowSeconds=window, attachSeconds=attach)
    k = sb.standby_size(arrivals, p)
    assert lo <= k <= hi
    assert sb.standby_size(arrivals, None) == 0
    # More arrivals never want fewer GPUs.
    assert sb.standby_size(arrivals + 1, p) >= k
    # The policy's own bounds, even built past its validation.
    bad = p.model_copy(update={"min_per_zone": hi + 1})
    assert sb.standby_size(arrivals, bad) <= hi


def test_policy_bounds_are_refused_with_a_clear_error():
    with pytest.raises(ValidationError, match="minPerZone must not exceed maxPerZone"):
        policy(minPerZone=5, maxPerZone=2)
    with pytest.raises(ValidationError):
        policy(maxPerZone=-1)
    with pytest.raises(ValidationError):
        policy(windowSeconds=0)
    spec = {
        "backend": "redfish-composition",
        "endpoint": "https://fm.example",
        "credentialsSecret": {"name": "c", "namespace": "ns"},
        "standby": {"maxPerZone": 2},
    }
    assert FabricSpec.model_validate(spec).standby == StandbyPolicy(max_per_zone=2)


# -- placement ---------------------------------------------------------------------------


def test_place_spreads_over_the_zone_fewest_first_then_recent_claims_then_name():
    assert sb.place(3, NODES, {}, {}) == ["node-a", "node-b", "node-c"]
    assert sb.place(2, NODES, {"node-a": 1}, {"node-c": 3}) == ["node-c", "node-b"]
    assert sb.place(4, NODES, {}, {}, fits=lambda n: n != "node-b") == [
        "node-a",
        "node-c",
        "node-a",
        "node-c",
    ]
    assert sb.place(2, (), {}, {}) == []
    assert sb.place(0, NODES, {}, {}) == []


@settings(max_examples=200)
@given(
    n=st.integers(min_value=0, max_value=30),
    held=st.lists(st.integers(min_value=0, max_value=5), min_size=3, max_size=3),
)
def test_place_stays_in_the_zone_and_evens_out(n: int, held: list[int]) -> None:
    start = dict(zip(NODES, held, strict=True))
    out = sb.place(n, NODES, start, {})
    assert len(out) == n and set(out) <= set(NODES)
    after = {nd: start[nd] + out.count(nd) for nd in NODES}
    if n >= sum(max(held) - h for h in held):
        assert max(after.values()) - min(after.values()) <= 1


# -- inputs ------------------------------------------------------------------------------


def fabric(name: str = "fab") -> JSON:
    return {"metadata": {"name": name}, "spec": {"standby": {"maxPerZone": 3}}}


def pool_slice(pool: str, nodes: list[str]) -> JSON:
    sel = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": sb.HOSTNAME_LABEL, "operator": "In", "values": nodes}]}
        ]
    }
    return {"spec": {"pool": {"name": pool}, "nodeSelector": sel, "devices": []}}


def node_slice(node: str) -> JSON:
    return {"spec": {"pool": {"name": node}, "nodeName": node, "devices": []}}


def test_zones_are_the_standby_fabrics_pools_on_nodes_with_a_plugin():
    by_fabric = sb.policies(
        [
            fabric("fab"),
            {"metadata": {"name": "plain"}, "spec": {}},
            {"metadata": {"name": "v"}, "spec": {"standby": {"maxPerZone": 1}, "vendorDriver": {}}},
            {"metadata": {"name": "bad"}, "spec": {"standby": {"maxPerZone": -3}}},
        ]
    )
    assert set(by_fabric) == {"fab"}
    slices = [
        pool_slice(POOL, ["node-a", "node-b", "node-x"]),
        pool_slice("plain/zone-1", ["node-a"]),
        node_slice("node-a"),
        node_slice("node-b"),
    ]
    [zone] = sb.zones_of(slices, by_fabric)
    assert (zone.pool, zone.fabric, zone.nodes) == (POOL, "fab", ("node-a", "node-b"))


def test_a_zone_selected_by_one_label_is_its_labelled_nodes_with_a_plugin():
    by_fabric = sb.policies([fabric("fab")])
    sel = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone.example/z1", "operator": "In", "values": ["on"]}]}
        ]
    }
    slices = [
        {"spec": {"pool": {"name": POOL}, "nodeSelector": sel, "devices": []}},
        node_slice("node-a"),
        node_slice("node-b"),
    ]
    carrying = {("zone.example/z1", "on"): ["node-a", "node-x"]}
    [zone] = sb.zones_of(slices, by_fabric, lambda k, v: carrying.get((k, v), []))
    assert zone.nodes == ("node-a",)
    [unresolved] = sb.zones_of(slices, by_fabric)  # no node labels known: no nodes
    assert unresolved.nodes == ()


def test_arrivals_are_claims_on_pool_devices_or_fabric_attached_gpus_of_the_zone():
    zone = sb.Zone(POOL, "fab", ("node-a", "node-b"), policy())
    on_pool = claim(uid="p", node="node-b")
    on_standby = claim(uid="s", device="gpu-u-1", pool="node-a", binding=False)
    on_builtin = claim(uid="b", device="gpu-local", pool="node-a", binding=False)
    unallocated = claim(uid="u", allocated=False)
    for c in (on_pool, on_standby, on_builtin):
        c["metadata"]["creationTimestamp"] = format_time(NOW - 7)
    out = sb.claim_arrivals(
        [on_pool, on_standby, on_builtin, unallocated],
        names.DRIVER,
        [zone],
        [("node-a", "gpu-u-1")],
        NOW,
    )
    assert set(out) == {"p", "s"}
    assert out["p"] == sb.Arrival(NOW - 7, frozenset({POOL}), "node-b")
    assert out["s"].pools == frozenset({POOL})


# -- the plan ----------------------------------------------------------------------------


def held(name: str, last: float, node: str = "node-a", **kw: Any) -> sb.Held:
    fields = {"model": "H100", "standby": True, "attaching": False, **kw}
    return sb.Held(name, POOL, node, fields["model"], last, fields["standby"], fields["attaching"])


def free(*devices: str, model: str = "H100") -> list[sb.FreeBlock]:
    return [sb.FreeBlock(POOL, d, d, model) for d in devices]


def arrivals(n: int, age: float = 5, node: str | None = None) -> tuple[sb.Arrival, ...]:
    return tuple(sb.Arrival(NOW - age, frozenset({POOL}), node) for _ in range(n))


def inputs(n: int, p: StandbyPolicy | None = None, age: float = 5) -> sb.StandbyInputs:
    return sb.StandbyInputs((sb.Zone(POOL, "fab", NODES, p or policy()),), arrivals(n, age))


def test_plan_attaches_what_is_missing_spread_over_the_zone():
    out = sb.plan(inputs(6), [], free("gpu-1", "gpu-2", "gpu-3", "gpu-4"), NOW)
    assert [(c.block.device, c.node) for c in out.create] == [
        ("gpu-4", "node-a"),
        ("gpu-3", "node-b"),
        ("gpu-2", "node-c"),
    ]
    assert out.zones[POOL] == sb.ZoneState(want=3, held=3)


def test_plan_counts_every_idle_gpu_and_keeps_the_most_recently_used():
    idle_now = [held("old", NOW - 500, standby=False), held("new", NOW - 10), held("mid", NOW - 50)]
    out = sb.plan(inputs(4), idle_now, free("gpu-1"), NOW)
    assert out.create == [] and out.keep == {"new", "mid"}


def test_plan_arrivals_outside_the_window_do_not_count():
    out = sb.plan(inputs(6, age=61), [], free("gpu-1"), NOW)
    assert out.create == [] and out.zones[POOL].want == 0


def test_plan_returns_standby_gpus_over_max_least_recently_used_first():
    p = policy(maxPerZone=2)
    gpus = [held(f"s{i}", NOW - 10 * i) for i in range(4)] + [held("r", NOW, standby=False)]
    out = sb.plan(inputs(4, p), gpus, [], NOW)
    assert out.keep == {"r", "s0"}
    assert out.surplus == ["s3", "s2"]


def test_plan_model_and_room():
    p = policy(model="A100")
    out = sb.plan(
        inputs(2, p), [held("h", NOW)], [*free("gpu-1"), *free("gpu-2", model="A100")], NOW
    )
    assert [c.block.device for c in out.create] == ["gpu-2"]
    out = sb.plan(inputs(2), [], free("gpu-1"), NOW, fits=lambda _f, _n, _m: False)
    assert out.create == []


@settings(max_examples=200)
@given(
    n_arrivals=st.integers(min_value=0, max_value=50),
    hi=st.integers(min_value=0, max_value=6),
    idle_ages=st.lists(st.integers(min_value=0, max_value=1000), max_size=8),
    n_free=st.integers(min_value=0, max_value=10),
)
def test_plan_never_holds_more_idle_than_the_policy_allows(
    n_arrivals: int, hi: int, idle_ages: list[int], n_free: int
) -> None:
    p = policy(maxPerZone=hi)
    gpus = [held(f"s{i}", NOW - a) for i, a in enumerate(idle_ages)]
    out = sb.plan(inputs(n_arrivals, p), gpus, free(*(f"gpu-{i}" for i in range(n_free))), NOW)
    assert len(out.keep) + len(out.create) <= out.zones[POOL].want <= hi
    # Every GPU here is a standby one: what stays idle after the surplus goes, with what
    # the plan attaches, is within maxPerZone.
    assert len(gpus) - len(out.surplus) + len(out.create) <= hi
    assert not set(out.surplus) & out.keep


# -- decide: the standby phase -----------------------------------------------------------


def snap(
    claims: list[JSON],
    resources: list[JSON],
    standby: sb.StandbyInputs,
    pool: tuple[str, ...] = ("gpu-1", "gpu-2", "gpu-3"),
    quarantines: list[JSON] | None = None,
    requests: list[JSON] | None = None,
    local: dict[tuple[str, str], str] | None = None,
) -> ScalerSnapshot:
    return ScalerSnapshot(
        now=NOW,
        claims=claims,
        resources=resources,
        pool_devices={(POOL, d): pool_device(d) for d in pool},
        local_devices=local or {},
        requests=requests or [],
        quarantines=quarantines or [],
        standby=standby,
    )


def run(s: ScalerSnapshot) -> list[Any]:
    return list(decide(s, CFG))


def test_decide_attaches_standby_gpus_marked_as_such_on_free_unallocated_blocks():
    allocated = claim(uid="c1", device="gpu-1", node="node-b")
    quarantined = {
        "metadata": {"name": "q", "annotations": {ANN_EXPIRES: format_time(NOW + 30)}},
        "spec": {"deviceSelector": {"driver": names.DRIVER, "pool": POOL, "device": "gpu-2"}},
    }
    holder = resource(claim_uid="c9", device="gpu-3", phase="Online", uuid="U9", name="r9")
    actions = run(snap([], [holder], inputs(6), pool=("gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5")))
    creates = [a for a in actions if isinstance(a, CreateResource)]
    assert [c.device for c in creates] == ["gpu-5", "gpu-4", "gpu-2"]
    actions = run(
        snap(
            [allocated],
            [holder],
            inputs(6),
            pool=("gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"),
            quarantines=[quarantined],
        ),
    )
    creates = [a for a in actions if isinstance(a, CreateResource) and a.claim is None]
    assert [c.device for c in creates] == ["gpu-5", "gpu-4"]
    body = creates[0].body
    assert body["metadata"]["labels"][sb.STANDBY_LABEL] == "true"
    assert body["metadata"]["annotations"][ANN_POOL] == POOL
    assert "claimRef" not in body["spec"]
    assert body["spec"]["targetNode"] in NODES
    assert creates[0].name == sb.standby_name(POOL, "gpu-5")


def test_decide_nothing_without_a_policy_or_demand():
    assert run(snap([], [], sb.StandbyInputs())) == []
    assert run(snap([], [], inputs(0))) == []


def standby_gpu(name: str, last: float, device: str, **kw: Any) -> JSON:
    cr = idle(name, last, uuid=f"U-{name}", **kw)
    cr["metadata"]["labels"][sb.STANDBY_LABEL] = "true"
    cr["metadata"]["annotations"][ANN_POOL] = POOL
    cr["metadata"]["annotations"][ANN_POOL_DEVICE] = device
    cr["spec"]["deviceID"] = device
    return cr


def test_the_idle_rule_keeps_what_the_standby_wants_and_returns_the_rest():
    # Idle well past the no-removal window (100 s): two kept for K = 2, one detached.
    gpus = [standby_gpu(f"s{i}", NOW - 200 - i, f"gpu-{i + 5}") for i in range(3)]
    actions = run(snap([], gpus, inputs(4)))
    assert [(a.name, a.reason) for a in actions] == [("s2", "IdleTimeout")]
    # Demand gone: K = 0, every one goes under the idle rule.
    actions = run(snap([], gpus, inputs(0)))
    assert sorted(a.name for a in actions if isinstance(a, DeleteResource)) == ["s0", "s1", "s2"]
    # Within the window and beyond K but under max: kept by the idle window.
    fresh = [standby_gpu(f"s{i}", NOW - 1 - i, f"gpu-{i + 5}") for i in range(3)]
    assert run(snap([], fresh, inputs(0))) == []


def test_standby_gpus_over_max_go_at_once_and_failed_ones_are_cleaned_up():
    p = policy(maxPerZone=1)
    gpus = [standby_gpu(f"s{i}", NOW - 1 - i, f"gpu-{i + 5}") for i in range(3)]
    actions = run(snap([], gpus, inputs(4, p)))
    assert sorted((a.name, a.reason) for a in actions) == [
        ("s1", "StandbySurplus"),
        ("s2", "StandbySurplus"),
    ]
    failed = standby_gpu("f", NOW, "gpu-9")
    failed["status"]["phase"] = "Failed"
    stuck = standby_gpu("t", NOW, "gpu-8")
    stuck["status"] = {"phase": "Attaching"}
    stuck["metadata"]["creationTimestamp"] = format_time(NOW - CFG.attach_timeout - 1)
    actions = run(snap([], [failed, stuck], inputs(0)))
    assert sorted((a.name, a.reason) for a in actions if isinstance(a, DeleteResource)) == [
        ("f", "StandbyFailed"),
        ("t", "StandbyFailed"),
    ]
    # Their blocks are quarantined: not attached again at the next pass.
    quarantined = [(a.pool, a.device) for a in actions if isinstance(a, Quarantine)]
    assert sorted(quarantined) == [(POOL, "gpu-8"), (POOL, "gpu-9")]


def test_an_attaching_standby_counts_and_a_used_one_stops_being_standby():
    attaching = standby_gpu("a", NOW, "gpu-9")
    attaching["status"] = {"phase": "Attaching"}
    assert run(snap([], [attaching], inputs(2))) == []  # K = 1, met by the attaching one
    # A claim is allocated a standby GPU: it loses the label, and its replacement waits a
    # pass, so the labelled idle GPUs never outnumber K.
    used = standby_gpu("u", NOW, "gpu-8")
    user = claim(uid="c5", device="gpu-u-u", pool="node-a", binding=False)
    local = {("node-a", "u-u"): "gpu-u-u"}
    actions = run(snap([user], [used], inputs(2), local=local))
    assert [(type(a).__name__, a.reason) for a in actions] == [
        ("PatchResource", "InUse"),
        ("PatchResource", "StandbyUsed"),
    ]
    assert actions[1].patch == {"metadata": {"labels": {sb.STANDBY_LABEL: None}}}
    assert standby_held([attaching, used]) == {POOL: 2}
    # The next pass: an ordinary GPU in use; a new standby GPU replaces it.
    marked = idle("u", NOW, uuid="U-u", ann={ANN_IN_USE_BY: "c5", ANN_POOL: POOL})
    actions = run(snap([user], [marked], inputs(2), local=local))
    assert [a.device for a in actions if isinstance(a, CreateResource)] == ["gpu-3"]
    assert standby_held([marked]) == {}


def test_a_composability_request_max_bounds_the_standby_per_node():
    req = {
        "spec": {"fabric": "fab", "model": "H100", "targetNode": "node-a", "size": 0, "maxSize": 0}
    }
    actions = run(snap([], [], inputs(6), requests=[req]))
    assert [a.body["spec"]["targetNode"] for a in actions] == ["node-b", "node-c", "node-b"]


# -- the scaler's inputs: arrivals outlive their claims, for the window ---------------------


def test_the_scaler_remembers_arrivals_for_the_window_after_their_claims_are_gone():
    from dataclasses import replace

    from device_scaler.scaler import Scaler, ScalerConfig
    from tests.unit.device_scaler.test_scaler import SlicesKube

    scaler = Scaler(SlicesKube([]), ScalerConfig(CFG))  # type: ignore[arg-type]  # not started
    try:
        scaler.fabrics.items = lambda: [fabric("fab")]  # type: ignore[method-assign]
        slices = [pool_slice(POOL, ["node-a"]), node_slice("node-a")]
        scaler.slices.items = lambda: slices  # type: ignore[method-assign]
        c = claim(uid="c1", node="node-a")
        c["metadata"]["creationTimestamp"] = format_time(NOW - 10)
        base = snap([c], [], sb.StandbyInputs())
        first = scaler._standby_inputs(base)
        assert [z.pool for z in first.zones] == [POOL]
        assert len(first.arrivals) == 1
        # The claim is gone: its arrival still counts within the window (300 s) ...
        assert len(scaler._standby_inputs(replace(base, claims=[])).arrivals) == 1
        # ... and not after it.
        late = replace(base, claims=[], now=NOW + 300)
        assert scaler._standby_inputs(late).arrivals == ()
        # No policy left: nothing to count.
        scaler.fabrics.items = lambda: []  # type: ignore[method-assign]
        assert scaler._standby_inputs(base) == sb.StandbyInputs()
    finally:
        scaler.stop()
