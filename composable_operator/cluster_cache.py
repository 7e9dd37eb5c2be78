"""What the operator reads of the cluster besides its own resources: ResourceClaims, our
driver's ResourceSlices and Nodes, in caches kept by watches (composable_dra.k8s.informer),
started once.

A detach pass reads these caches; only the step that ends something (the fabric call, or
letting the resource go) reads the API server itself, since a cache may lag behind an
allocation made just before the taint (docs/architecture.md, Invariants 2). A detach that
waits for the node's plugin to drop a device waits on the slice watch's events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from api.v1alpha1 import FabricSpec
from composable_dra.fabric.backend import Host
from composable_dra.fabric.registry import host_nodes
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kept import claim_fields, slice_uuid_fields
from composable_dra.k8s.kube import JSON, Kube, list_pages, path
from composable_dra.model.names import normalize_uuid
from composable_operator.reconcile import ClaimResult

RESOURCE = "resource.k8s.io/v1"


def claim_results(claims: Iterable[JSON]) -> list[ClaimResult]:
    """Every allocation result of every claim."""
    out = []
    for c in claims:
        key = f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        allocation = (c.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or []:
            out.append(
                ClaimResult(key, r.get("driver", ""), r.get("pool", ""), r.get("device", ""))
            )
    return out


def local_refs(slices: Iterable[JSON], node: str, uuid: str) -> set[tuple[str, str]]:
    """(pool, device) of the devices with this UUID in the node's own slices."""
    wanted = normalize_uuid(uuid)
    refs = set()
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("nodeName") != node:
            continue
        for d in spec.get("devices") or []:
            found = ((d.get("attributes") or {}).get("uuid") or {}).get("string", "")
            if found and normalize_uuid(found) == wanted:
                refs.add((spec["pool"]["name"], d["name"]))
    return refs


def slim_node(node: JSON) -> JSON:
    """The parts of a Node that mapping it to its fabric host reads (registry.host_for_node:
    systemUUID, providerID, annotations) and its Ready condition (a detach's host release,
    detach.node_ready), so that a cache of 1,000 Nodes does not keep their images and other
    conditions."""
    meta = node.get("metadata") or {}
    slim_meta: JSON = {"name": meta.get("name"), "annotations": dict(meta.get("annotations") or {})}
    if meta.get("deletionTimestamp"):
        slim_meta["deletionTimestamp"] = meta["deletionTimestamp"]
    status = node.get("status") or {}
    system_uuid = (status.get("nodeInfo") or {}).get("systemUUID", "")
    # Only Ready of its conditions: whether a detach can wait for the node's host release.
    ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "metadata": slim_meta,
        "spec": {"providerID": (node.get("spec") or {}).get("providerID", "")},
        "status": {"nodeInfo": {"systemUUID": system_uuid}, "conditions": ready},
    }


class Nodes:
    """Every Node, slimmed (slim_node), kept by one watch: the Fabric daemon maps hosts to
    nodes and an attach step finds its node without listing or reading Nodes."""

    def __init__(self, kube: Kube) -> None:
        self.informer = Informer(kube, path("v1", "nodes"), name="nodes", keep=slim_node)

    def synced(self) -> bool:
        return self.informer.synced.is_set()

    def get(self, name: str) -> JSON | None:
        return self.informer.get(name)

    def all(self) -> list[JSON]:
        return self.informer.items()


def node_per_host(
    nodes: Nodes | None, kube: Kube, spec: FabricSpec, hosts: Mapping[str, Host]
) -> dict[str, str]:
    """fabric host -> our (first) node on it: from the Node cache once it has listed,
    else from a list (no cache, as in tests)."""
    if nodes is not None and nodes.synced():
        found: Iterable[JSON] = nodes.all()
    else:
        found = kube.get(path("v1", "nodes"))["items"]
    return {h: names[0] for h, names in host_nodes(found, spec.node_mapping, hosts).items()}


class Changes:
    """Wakes coroutines of one event loop when an informer thread reports a change."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self.version = 0  # changes seen so far (read on the loop)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def notify(self) -> None:  # called on an informer's thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self.version += 1
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, since: int, limit: float) -> bool:
        """Until a change after ``since`` (a version read before the cache was; True) or
        the time limit (False)."""
        if self.version != since:
            return True
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        try:
            await asyncio.wait_for(event.wait(), max(0.0, limit))
        except TimeoutError:
            return False
        return True


class ClusterCache:
    """ResourceClaims, our driver's ResourceSlices and Nodes, each a list + watch."""

    def __init__(self, kube: Kube, driver: str) -> None:
        self.kube, self.driver = kube, driver
        self.slice_changes = Changes()
        self.nodes = Nodes(kube)
        # Of ~9,000 claims and ~1,000 node slices, only what claim_results and
        # local_refs read.
        self.claims = Informer(kube, path(RESOURCE, "resourceclaims"), keep=claim_fields)
        # Nodes' own slices only (local_refs reads nothing else): a pool slice of 64
        # devices, rewritten on most allocations of a burst, is not decoded here.
        self.slices = Informer(
            kube,
            path(RESOURCE, "resourceslices"),
            self.slice_changes.notify,
            keep=slice_uuid_fields,
            fieldSelector=f"spec.driver={driver},spec.nodeName!=",
        )

    def start(self) -> ClusterCache:
        self.claims.start()
        self.slices.start()
        self.nodes.informer.start()
        return self

    def stop(self) -> None:
        self.claims.stop()
        self.slices.stop()
        self.nodes.informer.stop()

    def synced(self) -> bool:
        return self.claims.synced.is_set() and self.slices.synced.is_set()

    def claim_results(self, consistent: bool) -> list[ClaimResult]:
        """From the cache, or (consistent) a list from the API server."""
        if consistent or not self.claims.synced.is_set():
            pages = list_pages(self.kube, path(RESOURCE, "resourceclaims"))
            return claim_results(c for body in pages for c in body.get("items") or [])
        return claim_results(self.claims.items())

    def local_refs(self, node: str, uuid: str, consistent: bool) -> set[tuple[str, str]]:
        if consistent or not self.slices.synced.is_set():
            listed = self.kube.get(
                path(RESOURCE, "resourceslices"),
                fieldSelector=f"spec.nodeName={node},spec.driver={self.driver}",
            )["items"]
            return local_refs(listed, node, uuid)
        return local_refs(self.slices.items(), node, uuid)
