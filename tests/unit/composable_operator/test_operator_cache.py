"""What the operator's watches keep (composable_operator.cluster_cache): of ~9,000 claims,
~1,000 node slices and 1,000 Nodes only the fields its readers use, and those readers
answer the same from the kept form as from whole objects. A ComposabilityRequest's pass
maps hosts to nodes from the Node cache, without listing Nodes."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from api.v1alpha1 import ComposabilityRequestSpec, FabricSpec
from composable_dra.fabric.backend import Device, Host, Inventory, Zone
from composable_dra.k8s.kept import claim_fields, slice_uuid_fields
from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from composable_operator.cluster_cache import ClusterCache, claim_results, local_refs, slim_node
from composable_operator.composability_requests import RequestReconciler
from composable_operator.reconcile import referencing_claims
from testbed.objects import as_scheduler_claim

DRIVER = names.DRIVER


def claim(i: int, results: list[JSON]) -> JSON:
    """A claim as the API server returns it: much that no reader of ours uses."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"c{i}",
            "namespace": "ns",
            "uid": f"uid-{i}",
            "resourceVersion": str(i),
            "labels": {"app": "x" * 50},
            "ownerReferences": [{"kind": "Pod", "name": f"p{i}", "uid": "o"}],
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "g"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": results, "config": [{"opaque": {"x": "y" * 100}}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "k"}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": f"p{i}", "uid": "o"}],
            "devices": [{"driver": DRIVER, "pool": "p", "device": "d", "conditions": []}],
        },
    }


def node_slice(node: str, uuids: list[str]) -> JSON:
    return {
        "metadata": {"name": f"{node}-slice", "uid": "s", "resourceVersion": "5"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 3, "resourceSliceCount": 1},
            "devices": [
                {
                    "name": f"gpu-{k}",
                    "attributes": {
                        "uuid": {"string": u},
                        "model": {"string": "H100"},
                        "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    },
                    "capacity": {"memory": {"value": "80Gi"}},
                }
                for k, u in enumerate(uuids)
            ],
        },
    }


def full_node(i: int) -> JSON:
    return {
        "metadata": {"name": f"n{i}", "uid": "u", "resourceVersion": "1", "labels": {"a": "b"}},
        "spec": {"providerID": f"fake://h{i}", "podCIDR": "10.0.0.0/24"},
        "status": {
            "nodeInfo": {"systemUUID": f"UUID-{i}", "kernelVersion": "6"},
            "images": [{"names": ["img"], "sizeBytes": 1}] * 20,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


names_ = st.text("abc-1", min_size=1, max_size=4)
result = st.fixed_dictionaries(
    {"driver": st.sampled_from([DRIVER, "other"]), "pool": names_, "device": names_},
    optional={"request": names_, "adminAccess": st.booleans()},
)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(result, max_size=3), max_size=4))
def test_kept_claims_give_the_same_allocation_results(allocations: list[list[JSON]]) -> None:
    claims = [claim(i, r) for i, r in enumerate(allocations)]
    assert claim_results([claim_fields(c) for c in claims]) == claim_results(claims)


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(
    st.lists(st.sampled_from(["GPU-a", "gpu-A", "GPU-b", ""]), max_size=4),
    st.sampled_from(["GPU-A", "GPU-b", "GPU-c"]),
)
def test_kept_slices_give_the_same_local_names(uuids: list[str], wanted: str) -> None:
    slices = [node_slice("n1", uuids), node_slice("n2", uuids)]
    kept = [slice_uuid_fields(s) for s in slices]
    assert local_refs(kept, "n1", wanted) == local_refs(slices, "n1", wanted)


def test_the_operators_watches_keep_only_what_it_reads() -> None:
    cache = ClusterCache(None, DRIVER)  # type: ignore[arg-type]  # not started: fed below
    results = [{"request": "gpu", "driver": DRIVER, "pool": "fab/z1", "device": "gpu-1"}]
    cache.claims.replace([claim(1, results)])
    cache.slices.replace([node_slice("n1", ["GPU-a"])])
    cache.nodes.informer.replace([full_node(1)])

    [kept_claim] = cache.claims.items()
    assert "spec" not in kept_claim and set(kept_claim["status"]) == {"allocation"}
    assert cache.claim_results(consistent=False) == claim_results([claim(1, results)])
    [kept_slice] = cache.slices.items()
    assert set(kept_slice["spec"]["devices"][0]["attributes"]) == {"uuid"}
    assert cache.local_refs("n1", "gpu-a", consistent=False) == {("n1", "gpu-0")}
    # One copy of each Node, the slim one (not the whole Node beside it).
    assert cache.nodes.all() == [slim_node(full_node(1))]
    assert cache.nodes.informer.items() == [slim_node(full_node(1))]


class Kube:
    """Answers lists of Nodes and ComposableResources; counts what it is asked."""

    def __init__(self, nodes: list[JSON]) -> None:
        self.nodes = nodes
        self.gets: list[str] = []
        self.created: list[JSON] = []

    def get(self, url_path: str, **_: Any) -> JSON:
        self.gets.append(url_path)
        return {"items": self.nodes if url_path.endswith("/nodes") else []}

    def create(self, _path: str, body: JSON) -> JSON:
        self.created.append(body)
        return body

    def merge_patch(self, _path: str, body: JSON) -> JSON:
        return body


class Fabrics:
    def __init__(self, inv: Inventory) -> None:
        self.inv = inv

    def get(self, _name: str) -> tuple[FabricSpec, Fabrics]:
        spec = FabricSpec.model_validate(
            {
                "backend": "redfish-composition",
                "endpoint": "https://fabric.example",
                "credentialsSecret": {"name": "s", "namespace": "ns"},
            }
        )
        return spec, self

    def inventory(self) -> Inventory:
        return self.inv


def test_a_request_pass_maps_hosts_from_the_node_cache_without_listing_nodes() -> None:
    n = 200
    hosts = {f"h{i}": Host(f"h{i}", f"uuid-{i}") for i in range(n)}
    inv = Inventory(
        hosts,
        {"gpu-1": Device("gpu-1", "H100", "z", "GPU-1", "free")},
        {"z": Zone("z", frozenset({"h7"}), frozenset({"gpu-1"}))},
    )
    nodes = [full_node(i) for i in range(n)]
    kube = Kube(nodes)
    cache = ClusterCache(kube, DRIVER)  # type: ignore[arg-type]
    cache.nodes.informer.replace(nodes)
    reconciler = RequestReconciler(kube, Fabrics(inv), cache.nodes)  # type: ignore[arg-type]
    spec = ComposabilityRequestSpec(fabric="fab", model="H100", size=1)
    plan, _ = reconciler.reconcile("req", spec)
    assert plan.create == [("gpu-1", "n7")]
    assert "/api/v1/nodes" not in kube.gets
    # Without a cache (or before it has listed) it lists, and plans the same.
    listing = Kube(nodes)
    plan, _ = RequestReconciler(listing, Fabrics(inv)).reconcile("req", spec)  # type: ignore[arg-type]
    assert plan.create == [("gpu-1", "n7")] and "/api/v1/nodes" in listing.gets


class PagedClaims:
    """Answers the list of claims ``limit`` at a time, as the API server does."""

    def __init__(self, claims: list[JSON]) -> None:
        self.claims = claims
        self.queries: list[dict[str, Any]] = []

    def get(self, _path: str, **query: Any) -> JSON:
        self.queries.append(query)
        start = int(query.get("continue") or 0)
        end = start + int(query.get("limit") or len(self.claims))
        more = {"continue": str(end)} if end < len(self.claims) else {}
        return {"items": self.claims[start:end], "metadata": {"resourceVersion": "9"} | more}


def test_a_consistent_read_of_the_claims_goes_page_by_page() -> None:
    results = [{"driver": DRIVER, "pool": "fab/z1", "device": "gpu-1"}]
    claims = [claim(i, results if i % 100 == 0 else []) for i in range(1201)]
    kube = PagedClaims(claims)
    found = ClusterCache(kube, DRIVER).claim_results(consistent=True)  # type: ignore[arg-type]
    assert found == claim_results(claims) and len(found) == 13
    assert [q.get("continue") for q in kube.queries] == [None, "500", "1000"]


def test_a_claim_the_scheduler_made_for_an_extended_resource_holds_the_device() -> None:
    """The detach check finds the device still allocated by a claim that kube-scheduler
    made for a pod's extended resource (generated name, the pod as owner), through the
    fields the cache keeps."""
    made = as_scheduler_claim(claim(0, [{"driver": DRIVER, "pool": "n1", "device": "gpu-0"}]))
    kept = claim_fields(made)
    key = f"{made['metadata']['namespace']}/{made['metadata']['name']}"
    assert referencing_claims(claim_results([kept]), DRIVER, {("n1", "gpu-0")}) == (key,)
