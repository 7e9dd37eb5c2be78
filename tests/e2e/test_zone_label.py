"""A pool's slices select their zone's nodes by one label while exactly the zone's nodes
carry it, and by the hostname list otherwise: kube-scheduler parses a slice's node selector
for every node it filters (docs/attach-flow.md, Scale). By default the publisher labels
each zone's Nodes itself (pool_publisher/node_labels.py); a label the Fabric names
(``spec.zoneNodeLabels``) is the admin's, and the publisher only reads it.
"""

from __future__ import annotations

from typing import Any

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import path
from pool_publisher.node_labels import own_label
from pool_publisher.zone_select import HOSTNAME_LABEL
from testbed.controlplane import free_port
from testbed.harness import Suite
from testbed.monitoring import scrape, total
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e

KEY = "fabric.e2e.example.com/zone-1"
HOSTS = ("node-1", "node-2", "node-3")


def topology() -> dict[str, Any]:
    """zone-1 reaches node-1 and node-2, zone-2 node-2 and node-3."""
    block = "NVIDIA H100 80GB HBM3"
    return {
        "hosts": [{"id": h} for h in HOSTS],
        "zones": [
            {
                "id": f"zone-{z}",
                "hosts": list(hosts),
                "blocks": [{"id": f"gpu-{z}-{i}", "model": block} for i in range(2)],
            }
            for z, hosts in ((1, HOSTS[:2]), (2, HOSTS[1:]))
        ],
    }


def selectors(suite: Suite) -> dict[str, list[dict[str, Any]]]:
    """zone -> the match expressions of its pool's slices."""
    out: dict[str, list[dict[str, Any]]] = {}
    for s in suite.pool_slices():
        zone = s["spec"]["pool"]["name"].split("/", 1)[1]
        for term in s["spec"]["nodeSelector"]["nodeSelectorTerms"]:
            out.setdefault(zone, []).extend(term["matchExpressions"])
    return out


def by_label(suite: Suite) -> bool:
    return selectors(suite).get("zone-1") == [{"key": KEY, "operator": "In", "values": ["true"]}]


def by_hostnames(suite: Suite, zone: str, hosts: tuple[str, ...]) -> bool:
    nodes = sorted(suite.node_of(h) for h in hosts)
    want = [{"key": HOSTNAME_LABEL, "operator": "In", "values": nodes}]
    return selectors(suite).get(zone) == want


def label(suite: Suite, host: str, value: str | None, key: str = KEY) -> None:
    """Set (or with None remove) a label by hand, as an admin's kubectl would."""
    node = path("v1", "nodes", suite.node_of(host))
    suite.kube.merge_patch(node, {"metadata": {"labels": {key: value}}})


def test_a_pool_selects_its_zone_by_one_label_only_while_exactly_its_nodes_carry_it(
    make_suite: MakeSuite, namespace: str
) -> None:
    """The admin's label (the Fabric names it), with the publisher's own labels off."""
    suite = make_suite(
        hosts=HOSTS, topology=topology(), attach_latency=0, publisher_args=["--no-label-nodes"]
    )
    wait_for(lambda: by_hostnames(suite, "zone-1", HOSTS[:2]), 30, "zone-1 by hostname")
    label(suite, "node-1", "true")
    label(suite, "node-2", "true")
    suite.kube.merge_patch(
        path(API_VERSION, "fabrics", suite.fabric),
        {"spec": {"zoneNodeLabels": {"zone-1": {"key": KEY}}}},
    )
    wait_for(
        lambda: by_label(suite), 30, "zone-1 by its label", describe=lambda: str(selectors(suite))
    )
    assert by_hostnames(suite, "zone-2", HOSTS[1:])  # no label named for zone-2

    # A pool claim's pod runs on a node of zone-1 or zone-2, with a pool GPU.
    suite.create_pod(namespace, "p", local_first=False)
    wait_for(lambda: suite.running(namespace, "p"), 120, "the pod running", describe=suite.describe)
    [result] = suite.claim(namespace, "p")["status"]["allocation"]["devices"]["results"]
    assert "/" in result["pool"]

    # A node the zone does not reach carries the label: back to the hostname list.
    label(suite, "node-3", "true")
    wait_for(lambda: by_hostnames(suite, "zone-1", HOSTS[:2]), 30, "zone-1 by hostname again")
    label(suite, "node-3", None)
    wait_for(lambda: by_label(suite), 30, "zone-1 by its label again")
    # A node of the zone loses it: the hostname list, until it carries it again.
    label(suite, "node-2", None)
    wait_for(
        lambda: by_hostnames(suite, "zone-1", HOSTS[:2]),
        30,
        "zone-1 by hostname, node-2 unlabelled",
    )


def own_key(suite: Suite, zone: str) -> str:
    return own_label(suite.fabric, zone).key


def carriers(suite: Suite, key: str) -> set[str]:
    """The nodes of this suite carrying ``key=true``."""
    nodes = suite.kube.get(path("v1", "nodes"))["items"]
    names = set(suite.node_names())
    return {
        n["metadata"]["name"]
        for n in nodes
        if n["metadata"]["name"] in names and (n["metadata"].get("labels") or {}).get(key) == "true"
    }


def by_own_labels(suite: Suite) -> bool:
    want = {
        z: [{"key": own_key(suite, z), "operator": "In", "values": ["true"]}]
        for z in ("zone-1", "zone-2")
    }
    return selectors(suite) == want


def test_by_default_the_publisher_labels_each_zones_nodes_and_its_pools_select_by_them(
    make_suite: MakeSuite, namespace: str
) -> None:
    port = free_port()
    suite = make_suite(
        hosts=HOSTS,
        topology=topology(),
        attach_latency=0,
        publisher_args=[f"--metrics-port={port}"],
    )
    k1, k2 = own_key(suite, "zone-1"), own_key(suite, "zone-2")
    node = suite.node_of
    wait_for(
        lambda: by_own_labels(suite),
        30,
        "both zones by the publisher's labels",
        describe=lambda: str(selectors(suite)),
    )
    # node-2 is in both zones: one key each.
    assert carriers(suite, k1) == {node("node-1"), node("node-2")}
    assert carriers(suite, k2) == {node("node-2"), node("node-3")}

    # A label removed by hand is put back.
    label(suite, "node-1", None, k1)
    wait_for(
        lambda: carriers(suite, k1) == {node("node-1"), node("node-2")}, 30, "node-1 relabelled"
    )
    assert by_own_labels(suite)

    # node-2 leaves both zones (the Fabric maps nodes by an annotation now, and node-2 has
    # none): the publisher removes its keys, and the pools still select by label.
    mapping = "e2e.example.com/fabric-host"
    for host in ("node-1", "node-3"):
        annotations = {"metadata": {"annotations": {mapping: host}}}
        suite.kube.merge_patch(path("v1", "nodes", node(host)), annotations)
    suite.kube.merge_patch(
        path(API_VERSION, "fabrics", suite.fabric),
        {"spec": {"nodeMapping": {"by": "annotation", "annotation": mapping}}},
    )
    wait_for(
        lambda: carriers(suite, k1) == {node("node-1")} and carriers(suite, k2) == {node("node-3")},
        30,
        "node-2's labels removed",
    )
    assert by_own_labels(suite)

    # A key of ours that someone else set on a node outside the zone is not ours to remove:
    # the zone falls back to hostnames (and the publisher does not fight over it).
    label(suite, "node-2", "true", k1)
    wait_for(lambda: by_hostnames(suite, "zone-1", ("node-1",)), 30, "zone-1 by hostname")
    assert carriers(suite, k1) == {node("node-1"), node("node-2")}
    label(suite, "node-2", None, k1)
    wait_for(lambda: by_own_labels(suite), 30, "zone-1 by its label again")
    # No write loop: one write per node at first, node-1's relabelling, node-2's removal.
    # (A write may repeat once where another update of the node lands before its event.)
    writes = total(scrape(port), "composable_dra_pool_publisher_node_label_writes_total")
    print(f"node label writes: {writes:.0f}")
    assert 5 <= writes <= 7, writes

    # A pool claim's pod runs, its pool selecting by the publisher's label.
    suite.create_pod(namespace, "p", local_first=False)
    wait_for(lambda: suite.running(namespace, "p"), 120, "the pod running", describe=suite.describe)
    [result] = suite.claim(namespace, "p")["status"]["allocation"]["devices"]["results"]
    assert "/" in result["pool"]


def test_with_no_label_nodes_no_node_is_labelled_and_pools_keep_hostname_lists(
    make_suite: MakeSuite,
) -> None:
    suite = make_suite(
        hosts=HOSTS, topology=topology(), attach_latency=0, publisher_args=["--no-label-nodes"]
    )
    wait_for(
        lambda: (
            by_hostnames(suite, "zone-1", HOSTS[:2]) and by_hostnames(suite, "zone-2", HOSTS[1:])
        ),
        30,
        "both zones by hostname",
        describe=lambda: str(selectors(suite)),
    )
    # The pools are published, and a publisher that labels would have labelled first.
    assert carriers(suite, own_key(suite, "zone-1")) == set()
    assert carriers(suite, own_key(suite, "zone-2")) == set()
