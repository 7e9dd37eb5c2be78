"""The publisher's own zone labels: which label each node carries, and when to write it."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from api import labels
from api.v1alpha1 import FabricSpec
from composable_dra.k8s.kube import KubeError
from pool_publisher import publish
from pool_publisher.node_labels import (
    DOMAIN,
    Written,
    apply_body,
    is_own,
    label_writes,
    overlay,
    own_label,
    wanted_labels,
    zone_labels,
)
from pool_publisher.zone_select import NodeLabel
from tests.unit.pool_publisher.test_pool_publisher import inventory

FAB = own_label("fab", "zone-1")
FAB2 = own_label("fab", "zone-2")
OTHER = own_label("other", "zone-1")


def node(name: str, labels_: dict[str, str] | None = None, rv: str = "1", **meta: Any) -> Any:
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels_ or {}, **meta}}


def test_a_valid_fabric_name_and_zone_id_make_the_key_as_they_are():
    assert own_label("fab", "zone-1") == NodeLabel(f"fab.{DOMAIN}/zone-1", "true")
    assert own_label("gpu.example.com", "Zone_A.1").key == f"gpu.example.com.{DOMAIN}/Zone_A.1"


def test_a_name_that_is_no_label_part_gets_a_short_deterministic_stand_in():
    long_fabric = "f" * 240  # a valid object name, too long for a key prefix with ours
    key = own_label(long_fabric, "zone-1").key
    assert labels.key_problem(key) is None
    assert key == own_label(long_fabric, "zone-1").key
    assert key != own_label("f" * 239, "zone-1").key
    for zone in ("zone 1/a", "-x-", "z" * 64, "ゾーン", ""):
        key = own_label("fab", zone).key
        assert labels.key_problem(key) is None, (zone, key)
        assert key == own_label("fab", zone).key
    assert own_label("fab", "z" * 64).key != own_label("fab", "z" * 65).key
    assert own_label("fab", "zone 1").key != own_label("fab", "zone_1").key


@given(st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z"), st.text(max_size=100))
def test_every_fabric_name_and_zone_id_make_a_valid_key_of_ours(fabric: str, zone: str) -> None:
    label = own_label(fabric, zone)
    assert labels.key_problem(label.key) is None
    assert labels.value_problem(label.value) is None
    assert is_own(label.key)


def test_keys_of_ours_are_told_from_others():
    assert is_own(FAB.key)
    assert not is_own("fabric.example.com/zone-1")
    assert not is_own("kubernetes.io/hostname")
    assert not is_own(DOMAIN)


def test_a_zone_the_fabric_names_a_label_for_keeps_it_the_others_get_ours():
    named = {"zone-1": NodeLabel("fabric.example.com/zone-1", "true")}
    zones = ["zone-1", "zone-2"]
    assert zone_labels("fab", named, zones, own=True) == {"zone-1": named["zone-1"], "zone-2": FAB2}
    assert zone_labels("fab", named, zones, own=False) == named  # --no-label-nodes


def test_a_node_in_two_zones_or_two_fabrics_carries_a_key_for_each():
    wanted = wanted_labels([(FAB, ["a", "b"]), (FAB2, ["b", "c"]), (OTHER, ["b"])])
    assert wanted == {
        "a": {FAB.key: "true"},
        "b": {FAB.key: "true", FAB2.key: "true", OTHER.key: "true"},
        "c": {FAB2.key: "true"},
    }


def test_only_nodes_whose_labels_differ_are_written_with_all_they_should_carry():
    wanted = wanted_labels([(FAB, ["a", "b"]), (FAB2, ["b"])])
    nodes = [
        node("a", {FAB.key: "true", "team": "x"}),  # as wanted: no write
        node("b", {FAB.key: "true"}),  # lacks zone-2's
        node("c", {FAB.key: "true"}),  # left the zone: in no zone now
        node("d"),  # in no zone, none of ours
        node("e", {FAB.key: "false"}),  # changed by hand: ours again
    ]
    wanted["e"] = {FAB.key: "true"}
    assert label_writes(nodes, wanted, {}) == {
        "b": {FAB.key: "true", FAB2.key: "true"},
        "c": {},  # applied with none of ours: the apply removes the key it owns
        "e": {FAB.key: "true"},
    }


def test_a_node_being_deleted_is_left_alone():
    gone = node("a", deletionTimestamp="2026-11-28T00:00:00Z")
    assert label_writes([gone], {"a": {FAB.key: "true"}}, {}) == {}


def test_a_fabric_not_read_removes_nothing():
    nodes = [node("a", {OTHER.key: "true"})]
    assert label_writes(nodes, {}, {}, keep=True) == {}
    assert label_writes(nodes, {"a": {FAB.key: "true"}}, {}, keep=True) == {
        "a": {FAB.key: "true", OTHER.key: "true"}
    }


def test_no_second_write_while_the_informer_has_not_seen_the_first():
    nodes = [node("a", rv="7")]
    want = {"a": {FAB.key: "true"}}
    written = {"a": Written("7", {FAB.key: "true"})}
    assert label_writes(nodes, want, written) == {}
    # The informer moved on and the label is gone again (removed by hand): relabelled.
    assert label_writes([node("a", rv="9")], want, written) == {"a": {FAB.key: "true"}}
    # Something else is wanted now: written at once.
    assert label_writes(nodes, {"a": {FAB2.key: "true"}}, written) == {"a": {FAB2.key: "true"}}


def test_a_key_of_ours_another_manager_holds_is_not_written_again():
    """An apply removes only what its manager owns: a key someone set by hand stays, and
    the write that could not remove it is not repeated (the pool selects by hostname)."""
    nodes = [node("a", {FAB.key: "true"}, rv="8")]
    assert label_writes(nodes, {}, {}) == {"a": {}}
    assert label_writes(nodes, {}, {"a": Written("7", {})}) == {}


def test_the_apply_configuration_holds_the_name_the_uid_and_our_labels_only():
    n = node("a", {"team": "x", FAB.key: "true"}, uid="u-1")
    assert apply_body(n, {FAB.key: "true"}) == {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "a", "uid": "u-1", "labels": {FAB.key: "true"}},
    }
    assert apply_body(n, {}) == {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "a", "uid": "u-1"},
    }


def test_a_pass_sees_its_own_writes_until_the_informer_does():
    answer = node("a", {FAB.key: "true"}, rv="8")
    written = {"a": Written("7", {FAB.key: "true"}, answer)}
    assert overlay([node("a", rv="7"), node("b")], written) == [answer, node("b")]
    newer = node("a", rv="9")
    assert overlay([newer], written) == [newer]


class NodeApplier:
    """Answers applies to Nodes as the API server would (a new resourceVersion); refuses
    the nodes in ``refuse``."""

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.refuse = refuse
        self.applied: list[tuple[str, Any, str]] = []

    def apply(self, url: str, body: Any, manager: str) -> Any:
        if url.rsplit("/", 1)[-1] in self.refuse:
            raise KubeError(403, "Forbidden", "nodes is forbidden")
        self.applied.append((url, body, manager))
        return {"metadata": {**body["metadata"], "resourceVersion": "2"}}


def test_the_publisher_writes_each_label_once_and_retries_a_refused_node_alone():
    kube = NodeApplier(refuse=frozenset({"b"}))
    pub = publish.PoolPublisher(kube, None)  # type: ignore[arg-type]  # not started
    nodes = [node("a", uid="u-a"), node("b")]
    wanted = {"a": {FAB.key: "true"}, "b": {FAB.key: "true"}}
    seen = pub._write_labels(nodes, wanted, keep=False)
    [(url, body, manager)] = kube.applied
    assert url == "/api/v1/nodes/a"
    assert manager == publish.FIELD_MANAGER
    assert body["metadata"] == {"name": "a", "uid": "u-a", "labels": {FAB.key: "true"}}
    # The pass sees a's label at once; b stays as it was, to be tried again later.
    assert [n["metadata"]["labels"] for n in seen] == [{FAB.key: "true"}, {}]
    assert 0 < pub._next_poll_in() <= publish.NODE_LABEL_RETRY_CAP
    # The informer has not caught up, and b's wait has not passed: no write at all.
    pub._write_labels(nodes, wanted, keep=False)
    assert len(kube.applied) == 1
    # b's wait passed and it is allowed now.
    kube.refuse = frozenset()
    pub._label_failures["b"] = (1, 0.0)
    pub._write_labels(nodes, wanted, keep=False)
    assert [u for u, _, _ in kube.applied] == ["/api/v1/nodes/a", "/api/v1/nodes/b"]
    assert pub._label_failures == {}


def test_with_no_label_nodes_the_pools_keep_their_hostname_lists():
    inv = inventory()
    nodes = [
        node_on("node-a", "uuid-host-1", {FAB.key: "true"}),
        node_on("node-b", "uuid-host-2", {FAB.key: "true"}),
        node_on("node-c", "uuid-host-3"),
    ]
    meta = {"name": "fab", "uid": "fab-uid"}
    spec = fabric_spec()
    on = publish.fabric_view(meta, spec, inv, nodes, [], own_labels=True)
    pools = publish.desired_pools(on, set())
    assert pools["fab/zone-1"].label == FAB
    assert pools["fab/zone-2"].label is None  # node-b and node-c: not labelled for zone-2
    off = publish.fabric_view(meta, spec, inv, nodes, [], own_labels=False)
    assert publish.desired_pools(off, set())["fab/zone-1"].label is None


def test_the_zones_the_publisher_labels_are_those_without_a_label_the_fabric_names():
    inv = inventory()
    spec = fabric_spec(zoneNodeLabels={"zone-1": {"key": "fabric.example.com/zone-1"}})
    hosts = {"host-1": ["node-a"], "host-2": ["node-b"], "host-3": ["node-c"]}
    assert publish.own_zone_labels("fab", spec, inv, hosts) == [(FAB2, ("node-b", "node-c"))]


def node_on(name: str, system_uuid: str, labels_: dict[str, str] | None = None) -> Any:
    out = node(name, labels_)
    out["status"] = {"nodeInfo": {"systemUUID": system_uuid}}
    return out


def fabric_spec(**fields: Any) -> FabricSpec:
    return FabricSpec.model_validate(
        {
            "backend": "redfish-composition",
            "endpoint": "https://fabric.example",
            "credentialsSecret": {"name": "s", "namespace": "ns"},
            **fields,
        }
    )
