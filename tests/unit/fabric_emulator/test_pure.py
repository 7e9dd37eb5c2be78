"""Decision logic without HTTP: topology, composition rules, fault rules, registry texts."""

from __future__ import annotations

import json

import pytest

from fabric_emulator import faults, messages, state, topology
from fabric_emulator.state import Composition, RedfishError

from .conftest import REDFISH_DATA


def test_default_topology_shape_and_stable_uuids() -> None:
    topo = topology.default()
    assert list(topo.hosts) == ["node-1", "node-2", "node-3"]
    assert list(topo.zones) == ["zone-1", "zone-2"]
    assert len(topo.blocks) == 8
    assert {b.model for b in topo.blocks.values()} == {topology.H100, topology.L40S}
    again = topology.default()
    assert topo.hosts["node-1"].uuid == again.hosts["node-1"].uuid
    assert topo.blocks["gpu-1"].uuid == again.blocks["gpu-1"].uuid
    assert topo.blocks["gpu-1"].uuid.startswith("GPU-")
    assert len({b.uuid for b in topo.blocks.values()}) == 8
    assert topo.zones_of_host("node-2") == ["zone-1", "zone-2"]
    assert topo.reachable("gpu-6", "node-3") and not topo.reachable("gpu-6", "node-1")


def test_topology_file_round_trip(tmp_path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "hosts:\n  - {id: a, uuid: 11111111-2222-3333-4444-555555555555}\n"
        "zones:\n  - id: z\n    hosts: [a]\n    blocks:\n"
        "      - {id: g, model: M, memory_mib: 1024, memory_type: GDDR6,"
        " uuid: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee}\n"
    )
    topo = topology.load(path)
    assert topo.hosts["a"].uuid == "11111111-2222-3333-4444-555555555555"
    block = topo.blocks["g"]
    assert (block.model, block.memory_mib, block.memory_type) == ("M", 1024, "GDDR6")
    assert block.uuid == "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert block.redfish_uuid == "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert topology.parse(json.loads(topology.dumps(topo))) == topo


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"hosts": []}, "at least one host"),
        ({"hosts": [{"id": "a"}, {"id": "a"}]}, "duplicate host"),
        ({"hosts": [{"id": "a"}], "zones": [{"id": "z", "hosts": ["b"]}]}, "unknown host"),
        (
            {"hosts": [{"id": "a"}], "zones": [{"id": "z", "blocks": [{"id": "g"}]}]},
            "model",
        ),
        (
            {
                "hosts": [{"id": "a"}],
                "zones": [{"id": "z", "blocks": [{"id": "g", "model": "M", "uuid": "x"}]}],
            },
            "not a UUID",
        ),
        ({"hosts": [{"id": "bad/id"}]}, "must match"),
        (
            {
                "hosts": [{"id": "a"}],
                "zones": [{"id": "z", "blocks": [{"id": "system-a", "model": "M"}]}],
            },
            "reserved",
        ),
    ],
)
def test_topology_errors(data: object, fragment: str) -> None:
    with pytest.raises(topology.TopologyError, match=fragment):
        topology.parse(data)


def _status_and_ids(fn) -> tuple[int, list[str]]:
    with pytest.raises(RedfishError) as exc:
        fn()
    return exc.value.status, [m["MessageId"] for m in exc.value.messages]


def test_check_change_rules() -> None:
    topo = topology.default()
    comp = Composition()
    state.check_change(topo, comp, "node-1", ["gpu-1"], [])
    state.apply_change(comp, "node-1", ["gpu-1"], [])
    assert comp.blocks_of("node-1") == ["gpu-1"]
    assert comp.state_of("gpu-1") == "Composed"
    # in use, by the same host or another
    for host in ("node-1", "node-2"):
        assert (
            _status_and_ids(lambda h=host: state.check_change(topo, comp, h, ["gpu-1"], []))[0]
            == 409
        )
    assert _status_and_ids(lambda: state.check_change(topo, comp, "node-1", ["nope"], [])) == (
        400,
        ["Composition.1.1.ResourceBlockNotFound"],
    )
    assert _status_and_ids(lambda: state.check_change(topo, comp, "node-1", ["gpu-6"], [])) == (
        400,
        ["Composition.1.1.IncompatibleZone"],
    )
    assert _status_and_ids(
        lambda: state.check_change(topo, comp, "node-1", ["system-node-2"], [])
    ) == (400, ["Composition.1.1.ResourceBlockInvalid"])
    assert _status_and_ids(lambda: state.check_change(topo, comp, "node-2", [], ["gpu-1"])) == (
        400,
        ["Composition.1.1.ResourceBlockInvalid"],
    )
    assert _status_and_ids(lambda: state.check_change(topo, comp, "ghost", ["gpu-2"], []))[0] == (
        404
    )
    # pending changes count as in use
    state.reserve(comp, "node-1", ["gpu-2"], ["gpu-1"])
    assert comp.state_of("gpu-2") == "Composing"
    assert _status_and_ids(lambda: state.check_change(topo, comp, "node-2", ["gpu-2"], []))[0] == (
        409
    )
    assert _status_and_ids(lambda: state.check_change(topo, comp, "node-1", [], ["gpu-1"]))[0] == (
        409
    )
    state.release(comp, ["gpu-2"], ["gpu-1"])
    assert comp.state_of("gpu-2") == "Unused"
    state.apply_change(comp, "node-1", [], ["gpu-1"])
    assert comp.attached == {}


def test_diff_links_and_persisted_form() -> None:
    topo = topology.default()
    comp = Composition()
    state.apply_change(comp, "node-2", ["gpu-1", "gpu-6"], [])
    uris = [
        "/redfish/v1/CompositionService/ResourceBlocks/system-node-2",
        "/redfish/v1/CompositionService/ResourceBlocks/gpu-6",
        "/redfish/v1/CompositionService/ResourceBlocks/gpu-7",
    ]
    assert state.diff_links(topo, comp, "node-2", uris) == (["gpu-7"], ["gpu-1"])
    with pytest.raises(RedfishError):
        state.diff_links(topo, comp, "node-2", ["/redfish/v1/Systems/node-1"])
    saved = json.loads(json.dumps(comp.to_json()))
    saved["attached"]["gpu-8"] = "node-1"  # not reachable: dropped on load
    loaded = Composition.from_json(saved, topo)
    assert loaded.attached == {"gpu-1": "node-2", "gpu-6": "node-2"}


def test_fault_rule_parsing() -> None:
    for bad in (
        {"kind": "explode"},
        {"kind": "status500", "count": -1},
        {"kind": "status500", "count": 1, "probability": 0.5},
        {"kind": "status500", "probability": 2},
        {"kind": "latency"},
        {"kind": "status500", "path": "("},
        {"kind": "status500", "colour": "red"},
    ):
        with pytest.raises(faults.FaultError):
            faults.parse_rule(bad, "1")


def test_fault_count_and_matching() -> None:
    f = faults.Faults()
    f.add({"kind": "status500", "method": "POST", "path": "AddResourceBlock$", "count": 2})
    f.add({"kind": "latency", "latency": 0.5})
    kinds = faults.REQUEST_KINDS
    assert f.decide("GET", "/x/AddResourceBlock", kinds).rule is None
    d = f.decide("POST", "/x/AddResourceBlock", kinds)
    assert d.rule is not None and d.rule.kind == "status500" and d.latency == 0.5
    assert f.decide("POST", "/x/AddResourceBlock", kinds).rule is not None
    assert f.decide("POST", "/x/AddResourceBlock", kinds).rule is None  # used up
    assert f.to_json()[0]["fired"] == 2 and f.to_json()[0]["count"] == 0
    # task_failure is only seen by the task kinds
    f.add({"kind": "task_failure"})
    assert f.decide("POST", "/a", kinds).rule is None
    assert f.decide("POST", "/a", faults.TASK_KINDS).rule is not None


def test_fault_probability_is_seeded() -> None:
    def draws(seed: int) -> list[bool]:
        f = faults.Faults()
        f.add({"kind": "status503", "probability": 0.5, "seed": seed})
        return [f.decide("GET", "/", faults.REQUEST_KINDS).rule is not None for _ in range(64)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert 10 < sum(draws(7)) < 54


def test_messages_match_the_published_registries() -> None:
    reg_dir = REDFISH_DATA / "registries"
    for prefix, full in messages.FULL_VERSIONS.items():
        registry = json.loads((reg_dir / f"{prefix}.{full}.json").read_text())
        assert registry["RegistryVersion"] == full
        for (p, key), d in messages.MESSAGES.items():
            if p != prefix:
                continue
            published = registry["Messages"][key]
            assert d.message == published["Message"], key
            assert d.severity == published["MessageSeverity"], key
            assert d.args == published["NumberOfArgs"], key
            assert d.resolution == published["Resolution"], key
    msg = messages.composition("ResourceBlockInUse", "gpu-1")
    assert msg["MessageId"] == "Composition.1.1.ResourceBlockInUse"
    assert msg["Message"] == "Resource block 'gpu-1' cannot be part of any new compositions."
    with pytest.raises(ValueError):
        messages.base("ResourceNotFound", "only one")
