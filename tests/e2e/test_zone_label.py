"""A pool's slices select their zone's nodes by the one label the Fabric names for the
zone (``spec.zoneNodeLabels``) while exactly the zone's nodes carry it, and by the
hostname list otherwise: kube-scheduler parses a slice's node selector for every node it
filters (docs/attach-flow.md, Scale). The publisher reads the label; the admin writes it.
"""

from __future__ import annotations

from typing import Any

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import path
from pool_publisher.zone_select import HOSTNAME_LABEL
from testbed.harness import Suite
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


def label(suite: Suite, host: str, value: str | None) -> None:
    node = path("v1", "nodes", suite.node_of(host))
    suite.kube.merge_patch(node, {"metadata": {"labels": {KEY: value}}})


def test_a_pool_selects_its_zone_by_one_label_only_while_exactly_its_nodes_carry_it(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite(hosts=HOSTS, topology=topology(), attach_latency=0)
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
