"""The pool publisher's own zone labels on Nodes: which label each node should carry.

A pool slice that selects its zone's nodes by one label costs kube-scheduler far less
than a hostname list, which it parses again for every node it filters (docs/attach-flow.md,
With the scheduler's defaults). Unless the Fabric names a label for a zone
(``spec.zoneNodeLabels``, the admin's), the publisher labels the zone's Nodes itself
(``--label-nodes``, on by default): ``<fabric>.zone.composable.dra.io/<zone>=true``, one
key per (fabric, zone), since zones of one fabric may share a node. It writes them with
server-side apply as its own field manager, with every key of ours the node should carry
and no other field, so that a key left out is removed (when the node leaves the zone or
the Fabric goes) and other labels are never touched.

Pure: ``own_label`` (the key), ``zone_labels`` (which label selects each zone),
``wanted_labels`` (node -> its labels of ours), ``label_writes`` (which nodes to write),
``overlay`` (a pass reads its own writes before the informer does).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from api.labels import DNS_SUBDOMAIN_RE
from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from pool_publisher.zone_select import NodeLabel

DOMAIN = f"zone.{names.PREFIX}"  # zone.composable.dra.io: keys are <fabric>.<DOMAIN>/<zone>
VALUE = "true"
_PREFIX_MAX = 253  # a label key's prefix: a DNS subdomain
_NAME_MAX = 63  # a label key's name part
_HASH = 10  # hex digits of the hash that stands in for a name too long or not valid
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH]


def _short(text: str, allowed: str, room: int) -> str:
    """A deterministic stand-in for ``text``: its allowed characters, cut to fit ``room``
    with the hash of the whole appended (names that share a beginning stay apart)."""
    cleaned = re.sub(f"[^{allowed}]+", "-", text).strip("-._")[: room - _HASH - 1].strip("-._")
    return f"{cleaned}-{_digest(text)}" if cleaned else f"z{_digest(text)}"


def _prefix(fabric: str) -> str:
    """``<fabric>.zone.composable.dra.io``. A Fabric's name is a DNS subdomain of up to
    253 characters, so the whole may be too long: then the name's first characters and a
    hash of it, as one DNS label (at most 63)."""
    whole = f"{fabric}.{DOMAIN}"
    if len(whole) <= _PREFIX_MAX and DNS_SUBDOMAIN_RE.fullmatch(whole):
        return whole
    return f"{_short(fabric.lower(), 'a-z0-9', _NAME_MAX)}.{DOMAIN}"


def _name(zone: str) -> str:
    """The zone id where it is a label name (1-63 letters, digits, '-', '_', '.', starting
    and ending with a letter or digit), else its first valid characters and a hash."""
    if len(zone) <= _NAME_MAX and _LABEL_NAME.fullmatch(zone):
        return zone
    return _short(zone, "A-Za-z0-9_.-", _NAME_MAX)


def own_label(fabric: str, zone: str) -> NodeLabel:
    """The label the publisher puts on the nodes of ``fabric``'s ``zone``."""
    return NodeLabel(f"{_prefix(fabric)}/{_name(zone)}", VALUE)


def is_own(key: str) -> bool:
    """Whether a label key is of the form ``own_label`` makes (ours to add and remove)."""
    prefix, slash, _ = key.partition("/")
    return bool(slash) and prefix.endswith(f".{DOMAIN}")


def zone_labels(
    fabric: str, named: Mapping[str, NodeLabel], zones: Iterable[str], own: bool
) -> dict[str, NodeLabel]:
    """zone id -> the label its pool selects by while exactly its nodes carry it: the one
    the Fabric names (``named``), else, with ``own``, the publisher's own."""
    out = {z: named[z] for z in zones if z in named}
    if own:
        out.update({z: own_label(fabric, z) for z in zones if z not in named})
    return out


def wanted_labels(zones: Iterable[tuple[NodeLabel, Iterable[str]]]) -> dict[str, dict[str, str]]:
    """node name -> the labels of ours it should carry, from (label, the zone's nodes) of
    every zone the publisher labels. A node in two zones carries two keys; a node in none
    is absent (it should carry none)."""
    out: dict[str, dict[str, str]] = {}
    for label, nodes in zones:
        for node in nodes:
            out.setdefault(node, {})[label.key] = label.value
    return out


@dataclass(frozen=True)
class Written:
    """The last write to a node's labels: the node's resourceVersion it was decided from,
    the labels of ours it applied, and the node as the server answered (kept fields)."""

    resource_version: str
    labels: Mapping[str, str]
    answer: JSON = field(default_factory=dict)


def _own_labels(node: JSON) -> dict[str, str]:
    have = (node.get("metadata") or {}).get("labels") or {}
    return {str(k): str(v) for k, v in have.items() if is_own(str(k))}


def label_writes(
    nodes: Iterable[JSON],
    wanted: Mapping[str, Mapping[str, str]],
    written: Mapping[str, Written],
    keep: bool = False,
) -> dict[str, dict[str, str]]:
    """node name -> the labels of ours to apply to it (every one it should carry), for the
    nodes whose labels differ from ``wanted``; nodes being deleted are left alone.

    ``keep``: a Fabric could not be read, so its zones are unknown: remove nothing this pass
    (the node's keys of ours that are not wanted stay in what is applied).

    No loop: a node is not written again with the same labels while the informer still
    shows the version the last write was decided from (the write's own event is on its
    way), nor at all for a key of ours that it should not carry but that another manager
    also owns (an apply cannot remove it; the selector then falls back to hostnames).
    """
    out: dict[str, dict[str, str]] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        name = str(meta.get("name", ""))
        have = _own_labels(node)
        want = dict(wanted.get(name, {}))
        if keep:
            want = {**have, **want}
        last = written.get(name)
        missing = any(have.get(k) != v for k, v in want.items())
        extra = bool(have.keys() - want.keys())
        if missing:
            in_flight = (
                last is not None
                and last.resource_version == str(meta.get("resourceVersion") or "")
                and dict(last.labels) == want
            )
            if not in_flight:
                out[name] = want
        elif extra and (last is None or dict(last.labels) != want):
            out[name] = want
    return out


def apply_body(node: JSON, labels: Mapping[str, str]) -> JSON:
    """The apply configuration: the node's name, its uid (the apply then fails for a node
    deleted or replaced since it was read, where it would create a Node) and our labels."""
    meta = node.get("metadata") or {}
    body_meta: JSON = {"name": meta["name"]}
    if meta.get("uid"):
        body_meta["uid"] = meta["uid"]
    if labels:
        body_meta["labels"] = dict(sorted(labels.items()))
    return {"apiVersion": "v1", "kind": "Node", "metadata": body_meta}


def overlay(nodes: Iterable[JSON], written: Mapping[str, Written]) -> list[JSON]:
    """The nodes, each replaced by the server's answer to our last write to it while the
    informer still shows the version that write was decided from: a pass then selects by
    the labels it has just written, not by the ones before (no switch to hostnames and
    back while the informer catches up)."""
    out = []
    for node in nodes:
        meta = node.get("metadata") or {}
        last = written.get(str(meta.get("name", "")))
        rv = str(meta.get("resourceVersion") or "")
        stale = last is not None and bool(last.answer) and last.resource_version == rv
        out.append(last.answer if stale and last is not None else node)
    return out
