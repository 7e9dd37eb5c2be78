"""How a pool's slices select their zone's nodes: one node label, or a hostname list.

A slice's ``nodeSelector`` is parsed again by kube-scheduler for every node it filters;
a ``kubernetes.io/hostname In [62 hostnames]`` term was most of its CPU at 1,000 nodes
(docs/attach-flow.md, Scale). A zone's label is the one the Fabric names
(``spec.zoneNodeLabels``, the admin writes it), else the publisher's own, which it writes
itself (node_labels.py; off with ``--no-label-nodes``). While exactly the zone's nodes carry
it, the selector is that one label; otherwise (no label, a node not yet labelled, a node
labelled that the zone does not reach) it stays the hostname list, so a pod never sees a
pool its node cannot attach from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from composable_dra.k8s.kube import JSON

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class NodeLabel:
    key: str
    value: str


def zone_carriers(
    nodes: Iterable[JSON], wanted: Mapping[str, NodeLabel]
) -> dict[str, tuple[NodeLabel, frozenset[str]]]:
    """zone id -> (its label, the nodes carrying it), in one pass over the nodes."""
    found: dict[str, set[str]] = {zone: set() for zone in wanted}
    for n in nodes:
        meta = n.get("metadata") or {}
        have = meta.get("labels") or {}
        for zone, label in wanted.items():
            if have.get(label.key) == label.value:
                found[zone].add(str(meta["name"]))
    return {zone: (wanted[zone], frozenset(found[zone])) for zone in wanted}


def zone_label(
    carried: tuple[NodeLabel, frozenset[str]] | None, zone_nodes: Iterable[str]
) -> NodeLabel | None:
    """The zone's label if exactly its nodes carry it, else None (select by hostname)."""
    if carried is None:
        return None
    label, have = carried
    return label if have == frozenset(zone_nodes) else None


def node_selector(label: NodeLabel | None, nodes: Iterable[str]) -> JSON:
    """A slice's nodeSelector: one term (matchFields allows a single value only)."""
    if label is not None:
        requirement: JSON = {"key": label.key, "operator": "In", "values": [label.value]}
    else:
        requirement = {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}
    return {"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}
