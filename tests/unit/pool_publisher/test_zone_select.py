"""Pool slices select their zone's nodes by one label when exactly those nodes carry it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from api import labels
from api.v1alpha1 import ZoneNodeLabel
from pool_publisher.publish import desired_pools, plan_pools, pool_slices
from pool_publisher.zone_select import (
    HOSTNAME_LABEL,
    NodeLabel,
    node_selector,
    zone_carriers,
    zone_label,
)
from tests.unit.pool_publisher.test_pool_publisher import DRIVER, inventory, served, view

Z1 = NodeLabel("fabric.example.com/zone-1", "true")


def requirement(selector: dict[str, Any]) -> dict[str, Any]:
    [term] = selector["nodeSelectorTerms"]
    [req] = term["matchExpressions"]
    return dict(req)


def node(name: str, labels_: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels_}}


def test_the_selector_is_one_label_value_or_the_hostname_list():
    assert requirement(node_selector(Z1, ["a", "b"])) == {
        "key": Z1.key,
        "operator": "In",
        "values": ["true"],
    }
    assert requirement(node_selector(None, ["a", "b"])) == {
        "key": HOSTNAME_LABEL,
        "operator": "In",
        "values": ["a", "b"],
    }


def test_the_label_is_used_only_when_exactly_the_zones_nodes_carry_it():
    assert zone_label((Z1, frozenset({"a", "b"})), ["a", "b"]) == Z1
    assert zone_label((Z1, frozenset({"a"})), ["a", "b"]) is None  # b not labelled yet
    assert zone_label((Z1, frozenset({"a", "b", "x"})), ["a", "b"]) is None  # x unreachable
    assert zone_label(None, ["a"]) is None


def test_carriers_of_every_zone_in_one_pass():
    z2 = NodeLabel("fabric.example.com/zone-2", "yes")
    nodes = [
        node("a", {Z1.key: "true"}),
        node("b", {Z1.key: "true", z2.key: "yes"}),
        node("c", {Z1.key: "false", z2.key: "yes"}),
        {"metadata": {"name": "d"}},
    ]
    assert zone_carriers(nodes, {"zone-1": Z1, "zone-2": z2}) == {
        "zone-1": (Z1, frozenset({"a", "b"})),
        "zone-2": (z2, frozenset({"b", "c"})),
    }


def labelled_view(carriers: frozenset[str]) -> Any:
    return dataclasses.replace(view(inventory()), zone_labels={"zone-1": (Z1, carriers)})


def test_a_pool_selects_by_label_and_falls_back_to_hostnames_while_the_labels_differ():
    # zone-1 reaches host-1 and host-2: node-a and node-b.
    pools = desired_pools(labelled_view(frozenset({"node-a", "node-b"})), set())
    [sl] = pool_slices(pools["fab/zone-1"], 1, DRIVER)
    assert requirement(sl["spec"]["nodeSelector"])["key"] == Z1.key
    [other] = pool_slices(pools["fab/zone-2"], 1, DRIVER)  # no label named: hostnames
    assert requirement(other["spec"]["nodeSelector"])["values"] == ["node-b", "node-c"]
    partial = desired_pools(labelled_view(frozenset({"node-a"})), set())
    [sl] = pool_slices(partial["fab/zone-1"], 1, DRIVER)
    assert requirement(sl["spec"]["nodeSelector"])["values"] == ["node-a", "node-b"]


def test_switching_selector_rewrites_the_pool_once_and_then_nothing():
    hostnames = desired_pools(labelled_view(frozenset({"node-a"})), set())
    first = plan_pools(hostnames, [], DRIVER)
    by_label = desired_pools(labelled_view(frozenset({"node-a", "node-b"})), set())
    plan = plan_pools(by_label, served(first.apply), DRIVER, first.generations)
    assert {s["spec"]["pool"]["name"] for s in plan.apply} == {"fab/zone-1"}
    again = plan_pools(by_label, served(plan.apply + first.apply[1:]), DRIVER, plan.generations)
    assert again.empty


def test_a_node_joining_a_labelled_zone_writes_no_slice():
    """With the label, the slices do not name nodes: membership changes cost no write."""
    inv = inventory()
    v = dataclasses.replace(
        view(inv), zone_labels={"zone-1": (Z1, frozenset({"node-a", "node-b"}))}
    )
    first = plan_pools(desired_pools(v, set()), [], DRIVER)
    # node-c joins zone-1's host set and carries the label.
    zone1 = dataclasses.replace(
        inv.zones["zone-1"], hosts=frozenset({"host-1", "host-2", "host-3"})
    )
    grown = dataclasses.replace(inv, zones={**inv.zones, "zone-1": zone1})
    v2 = dataclasses.replace(
        view(grown), zone_labels={"zone-1": (Z1, frozenset({"node-a", "node-b", "node-c"}))}
    )
    desired = desired_pools(v2, set())
    assert desired["fab/zone-1"].nodes == ("node-a", "node-b", "node-c")
    assert plan_pools(desired, served(first.apply), DRIVER, first.generations).empty


KEYISH = st.one_of(
    st.text(max_size=80), st.from_regex(r"\A([a-z0-9.-]{1,20}/)?[A-Za-z0-9._-]{1,70}\Z")
)


@given(KEYISH)
def test_the_fabric_accepts_a_zone_label_key_exactly_when_it_is_a_label_key(key: str) -> None:
    try:
        ZoneNodeLabel(key=key)
    except ValidationError:
        assert labels.key_problem(key) is not None or not key
    else:
        assert labels.key_problem(key) is None


@given(st.one_of(st.text(max_size=80), st.from_regex(r"\A[A-Za-z0-9._-]{0,70}\Z")))
def test_the_fabric_accepts_a_zone_label_value_exactly_when_it_is_a_label_value(value: str) -> None:
    try:
        ZoneNodeLabel(key="a/b", value=value)
    except ValidationError:
        assert labels.value_problem(value) is not None
    else:
        assert labels.value_problem(value) is None


@pytest.mark.parametrize("key", ["fabric.example.com/zone-1", "zone", "a.b/c_d.e", "x" * 63])
def test_ordinary_label_keys_are_accepted(key: str) -> None:
    assert ZoneNodeLabel(key=key).value == "true"
