"""Warm standby end to end (deploy/examples/warm-standby.yaml): the real control plane and
scheduler, the Redfish emulator, every component a process, two real nodes (the upstream
kubelet, containerd, runc).

The suite's Fabric gets the example's ``spec.standby`` (with a shorter window, so that the
demand falls within the test). After a warm-up of claims, the scaler attaches standby GPUs
and the nodes publish them as local devices; the example's claim is allocated one of them
with no binding condition (no FabricDeviceReady wait); the standby never holds more idle
GPUs than maxPerZone; the pod's container prints the standby GPU; and once the demand is
gone they are detached under the idle rule.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from device_scaler.standby import STANDBY_LABEL
from hack.bench.standby import Held
from pool_publisher.node_labels import own_label
from testbed import examples
from testbed.crds import install_crds
from testbed.realnode_pods import for_real_node
from testbed.realnodes import describe_nodes, printed_gpus, suite_pod
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e
RESOURCE = "resource.k8s.io/v1"
EXAMPLE = "warm-standby"
HOSTS = ("node-1", "node-2")
TOPOLOGY = {
    "hosts": [{"id": h} for h in HOSTS],
    "zones": [
        {
            "id": "zone-1",
            "hosts": list(HOSTS),
            "blocks": [{"id": f"gpu-{i}", "model": "NVIDIA H100 80GB HBM3"} for i in range(1, 7)],
        }
    ],
}


def example(kind: str) -> JSON:
    return next(o for o in examples.load(EXAMPLE) if o["kind"] == kind)


def standby_resources(suite: Any) -> list[JSON]:
    return [r for r in suite.resources() if STANDBY_LABEL in r["metadata"].get("labels", {})]


def online_standby_uuids(suite: Any) -> dict[str, str]:
    """Normalized UUID -> node of every Online standby GPU."""
    return {
        normalize_uuid(r["status"]["deviceUUID"]): r["spec"]["targetNode"]
        for r in standby_resources(suite)
        if (r.get("status") or {}).get("phase") == "Online" and r["status"].get("deviceUUID")
    }


def allocated(suite: Any, namespace: str) -> set[tuple[str, str]]:
    claims = suite.kube.get(path(RESOURCE, "resourceclaims", namespace=namespace))["items"]
    return {
        (r["pool"], r["device"])
        for c in claims
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        )
        or []
    }


def free_standby(suite: Any, namespace: str) -> set[str]:
    """Standby GPUs that their node publishes as a local device and no claim holds."""
    standby = online_standby_uuids(suite)
    taken = allocated(suite, namespace)
    return {
        u
        for host in HOSTS
        for d in suite.local_devices(host)
        if (u := normalize_uuid(d["attributes"]["uuid"]["string"])) in standby
        and standby[u] == suite.node_of(host)
        and (suite.node_of(host), d["name"]) not in taken
    }


def select_zone_by_label(suite: Any, pool: str) -> None:
    """Wait for the pool to select its zone by the label the publisher puts on the zone's
    nodes (its default): the scaler then finds the zone's nodes through their labels."""
    key = own_label(suite.fabric, "zone-1").key
    want = [{"key": key, "operator": "In", "values": ["true"]}]
    wait_for(
        lambda: (
            [
                s["spec"]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"]
                for s in suite.pool_slices()
                if s["spec"]["pool"]["name"] == pool
            ]
            == [want]
        ),
        30,
        "the pool selecting its zone by label",
    )


# Long because it is one scenario read top to bottom; its steps share what it built.
@pytest.mark.parametrize("by_label", [False, True], ids=["hostnames", "zone-label"])
def test_standby_gpus_serve_claims_locally_and_go_back_when_demand_falls(
    make_suite: MakeSuite, namespace: str, by_label: bool
) -> None:
    # Hostnames: the publisher labels no node (the Fabric names no label either).
    suite = make_suite(
        hosts=HOSTS,
        real_hosts=HOSTS,
        topology=TOPOLOGY,
        no_removal=5.0,
        publisher_args=[] if by_label else ["--no-label-nodes"],
    )
    policy = dict(example("Fabric")["spec"]["standby"])
    policy["windowSeconds"] = 90  # the demand falls within the test
    max_per_zone = int(policy["maxPerZone"])
    pool = f"{suite.fabric}/zone-1"

    if by_label:
        select_zone_by_label(suite, pool)
    watch = Held()
    informer = Informer(
        suite.kube, path(API_VERSION, "composableresources"), on_event=watch, name="standby"
    )
    watch.informer = informer
    informer.start()
    try:
        suite.kube.merge_patch(
            path(API_VERSION, "fabrics", suite.fabric), {"spec": {"standby": policy}}
        )

        # Warm-up: two claims served from the pool; their pods keep their GPUs.
        for name in ("w1", "w2"):
            suite_pod(suite, namespace, name)
        for name in ("w1", "w2"):
            wait_for(functools.partial(suite.running, namespace, name), 90, f"warm-up pod {name}")

        # K = ceil(2 arrivals x 30 s / 90 s) = 1: one standby GPU, attached and local.
        wait_for(
            lambda: free_standby(suite, namespace),
            90,
            "a standby GPU attached and published as a node's local device",
            describe=suite.describe,
        )

        # The example's claim: allocated the standby GPU, no binding condition to wait on.
        standby_before = free_standby(suite, namespace)
        template = example("ResourceClaimTemplate")
        suite.kube.create(path(RESOURCE, "resourceclaimtemplates", namespace=namespace), template)
        image = next(iter(suite.real_nodes.values())).image
        pod = suite.on_own_nodes(for_real_node(example("Pod"), None, image))
        suite.kube.create(path("v1", "pods", namespace=namespace), pod)
        wait_for(
            lambda: suite.running(namespace, "gpu-standby"),
            60,
            "the example's pod to run",
            describe=lambda: describe_nodes(suite),
        )
        bound = suite.pod(namespace, "gpu-standby")
        claim_name = bound["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = suite.claim(namespace, claim_name)
        [r] = claim["status"]["allocation"]["devices"]["results"]
        assert r["request"] == "gpu/local" and r["pool"] == bound["spec"]["nodeName"], r
        assert not r.get("bindingConditions"), r
        assert not [
            c
            for d in claim["status"].get("devices") or []
            for c in d.get("conditions") or []
            if c["type"] == names.FABRIC_DEVICE_READY
        ]
        local = {
            d["name"]: normalize_uuid(d["attributes"]["uuid"]["string"])
            for host in HOSTS
            if suite.node_of(host) == r["pool"]
            for d in suite.local_devices(host)
        }
        assert local[r["device"]] in standby_before, (r, standby_before)
        real = suite.real_nodes[suite.host_of_node(r["pool"])]
        printed = printed_gpus(real, namespace, "gpu-standby")
        assert normalize_uuid(printed) == local[r["device"]]
        assert max(watch.most.values(), default=0) >= 1

        # Demand gone: after the window K is 0 and the idle rule returns every standby GPU.
        for name in ("w1", "w2", "gpu-standby"):
            suite.kube.delete(path("v1", "pods", name, namespace=namespace))
        for name in ("w1", "w2"):
            suite.kube.delete(path(RESOURCE, "resourceclaims", name, namespace=namespace))
        wait_for(
            lambda: not standby_resources(suite),
            240,
            "the standby GPUs to be detached once the demand is gone",
            describe=suite.describe,
        )
        assert watch.most.get(pool, 0) <= max_per_zone, watch.most
        assert set(watch.most) <= {pool}
    finally:
        informer.stop()


def fabric_with(name: str, standby: JSON, **spec: Any) -> JSON:
    body = {
        "backend": "redfish-composition",
        "endpoint": "https://fm.example:8443",
        "credentialsSecret": {"name": "fm", "namespace": "ops"},
        "standby": standby,
        **spec,
    }
    return {"apiVersion": API_VERSION, "kind": "Fabric", "metadata": {"name": name}, "spec": body}


@pytest.mark.parametrize(
    ("standby", "spec", "complaint"),
    [
        ({"maxPerZone": 1, "minPerZone": 2}, {}, "minPerZone must not exceed maxPerZone"),
        ({"maxPerZone": 2000}, {}, "maxPerZone"),
        ({"maxPerZone": -1}, {}, "maxPerZone"),
        ({"minPerZone": 1}, {}, "maxPerZone"),  # required
        ({"maxPerZone": 2, "windowSeconds": 5}, {}, "windowSeconds"),
        ({"maxPerZone": 2, "attachSeconds": 0}, {}, "attachSeconds"),
        ({"maxPerZone": 2}, {"vendorDriver": {"name": "gpu.nvidia.com"}}, "not with vendorDriver"),
    ],
)
def test_the_crd_refuses_bad_standby_policies(
    kube_json: Kube, unique: str, standby: JSON, spec: JSON, complaint: str
) -> None:
    install_crds(kube_json)
    with pytest.raises(KubeError) as exc:
        kube_json.create(path(API_VERSION, "fabrics"), fabric_with(f"sb-{unique}", standby, **spec))
    assert exc.value.status == 422, exc.value
    assert complaint in exc.value.message


def test_the_crd_defaults_a_standby_policy(kube_json: Kube, unique: str) -> None:
    install_crds(kube_json)
    # The example's Fabric as it stands is valid (a dry run: its endpoint is made up).
    whole = kube_json.request(
        "POST", path(API_VERSION, "fabrics"), body=example("Fabric"), query={"dryRun": "All"}
    )
    assert whole["spec"]["standby"]["maxPerZone"] == 2
    body = fabric_with(f"sb-{unique}", dict(example("Fabric")["spec"]["standby"]))
    created = kube_json.create(path(API_VERSION, "fabrics"), body)
    try:
        assert created["spec"]["standby"] == {
            "maxPerZone": 2,
            "minPerZone": 0,
            "windowSeconds": 300,
            "attachSeconds": 30,
        }
        bare = fabric_with(f"sb2-{unique}", {"maxPerZone": 3})
        defaulted = kube_json.create(path(API_VERSION, "fabrics"), bare)
        kube_json.delete(path(API_VERSION, "fabrics", f"sb2-{unique}"))
        assert defaulted["spec"]["standby"] == {
            "maxPerZone": 3,
            "minPerZone": 0,
            "windowSeconds": 300,
            "attachSeconds": 30,
        }
    finally:
        kube_json.delete(path(API_VERSION, "fabrics", f"sb-{unique}"))
