"""The reads a decision about one ComposableResource needs: its device, its node and the
node's fabric host, and the claims and slices that name the device.

The node, claims and slices come from the watches' cache (``ClusterCache``) unless a
read must be consistent; the node's host from the hosts the Fabric daemon's last pass
read (``Inventories``); the device from the fabric, one request (``Picks.read_device``).
Blocking calls run in threads, off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.v1alpha1 import ComposableResourceSpec, FabricSpec
from composable_dra.fabric.backend import Device, FabricBackend
from composable_dra.fabric.registry import host_for_node
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from composable_operator.cluster_cache import ClusterCache
from composable_operator.inventories import Inventories
from composable_operator.picks import Picks
from composable_operator.reconcile import ClaimResult


@dataclass
class ClusterReads:
    kube: Kube
    driver: str
    inventories: Inventories
    picks: Picks
    # ResourceClaims, our ResourceSlices and Nodes kept by watches (started by the
    # operator); None: every read lists.
    cache: ClusterCache | None = None

    def node(self, name: str, consistent: bool = True) -> JSON | None:
        """The Node (slimmed, cluster_cache.slim_node, when from the cache): from the
        watch's cache, or (consistent, no cache, or not in it) from the API server."""
        cache = self.cache
        if not consistent and cache is not None and cache.nodes.synced():
            found = cache.nodes.get(name)
            if found is not None:
                return found
        return self.kube.get_or_none(path("v1", "nodes", name))

    def node_host(
        self, fabric_name: str, fabric: FabricSpec, backend: FabricBackend, node: JSON
    ) -> str | None:
        """The node's fabric host, from the hosts the last inventory pass (or the last
        miss) read; on a miss the hosts are read again, once (shared by concurrent
        callers), since a node may have joined the fabric since."""
        mapping = fabric.node_mapping
        known = self.inventories.hosts(fabric_name)
        if known is not None:
            host = host_for_node(node, mapping, known.hosts, known.by_uuid)
            if host is not None:
                return host
        known = self.inventories.set_hosts(fabric_name, backend.hosts())
        return host_for_node(node, mapping, known.hosts, known.by_uuid)

    def claim_results(self, consistent: bool = True) -> list[ClaimResult]:
        """Every claim's allocation results: from the watch's cache, or (consistent, and
        whenever there is no cache) from the API server itself."""
        return self.cache_or_list().claim_results(consistent)

    def cache_or_list(self) -> ClusterCache:
        if self.cache is None:
            self.cache = ClusterCache(self.kube, self.driver)  # not started: lists
        return self.cache

    def device_refs(
        self, spec: ComposableResourceSpec, device: Device | None, consistent: bool = True
    ) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        """The (pool, device) names under which the device can be allocated: all of them,
        and those of them in the target node's own slices."""
        if device is None:
            return set(), set()
        local = self.cache_or_list().local_refs(spec.target_node, device.uuid, consistent)
        return {(names.pool_name(spec.fabric, device.zone), spec.device_id)} | local, local

    async def fabric(
        self,
        fabric: FabricSpec,
        backend: FabricBackend,
        spec: ComposableResourceSpec,
        status: Mapping[str, Any],
        uid: str,
        name: str,
        consistent: bool = False,
    ) -> tuple[Device | None, str | None, JSON | None]:
        """What a decision about one resource needs: its device, read now (one request;
        Picks.read_device); its node (from the watch's cache unless ``consistent``) and the
        node's fabric host (from the known hosts: node_host), with no read of every host
        per step."""

        def node_and_host() -> tuple[JSON | None, str | None]:
            node = self.node(spec.target_node, consistent)
            host = self.node_host(spec.fabric, fabric, backend, node) if node else None
            return node, host

        device, (node, host) = await asyncio.gather(
            self.picks.read_device(backend, spec, status, uid, name),
            asyncio.to_thread(node_and_host),
        )
        return device, host, node
