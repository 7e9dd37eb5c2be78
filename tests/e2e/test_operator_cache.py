"""The operator's slice watch on a real API server: nodes' own slices of our driver only
(composable_operator/cluster_cache.py), not the pool slices that a burst rewrites."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.k8s.resource_slices import write_slices
from composable_dra.model import names
from composable_operator.cluster_cache import ClusterCache
from testbed.objects import RESOURCE
from testbed.wait import wait_for


def _slice(name: str, where: JSON) -> JSON:
    return {
        "apiVersion": RESOURCE,
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": names.DRIVER,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            **where,
            "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-0"}}}],
        },
    }


@pytest.fixture
def slices(kube_json: Kube, unique: str) -> Iterator[tuple[str, str]]:
    own, pool = f"node-{unique}", f"pool-{unique}"
    selector = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": [unique]}]}
        ]
    }
    write_slices(
        kube_json,
        [_slice(own, {"nodeName": own}), _slice(pool, {"nodeSelector": selector})],
        [],
        "test",
    )
    yield own, pool
    for name in (own, pool):
        kube_json.delete(path(RESOURCE, "resourceslices", name))


def test_the_operator_caches_nodes_own_slices_and_no_pool_slice(
    kube_json: Kube, slices: tuple[str, str]
) -> None:
    own, pool = slices
    cache = ClusterCache(kube_json, names.DRIVER).start()
    try:
        wait_for(cache.synced, timeout=30, what="the operator's caches")
        kept = {s["metadata"]["name"] for s in cache.slices.items()}
        assert own in kept and pool not in kept
        assert cache.local_refs(own, "GPU-0", consistent=False) == {(own, "gpu-0")}
    finally:
        cache.stop()
