"""A GPU from the fabric's pool through the installed chart, on two real nodes.

`helm install` of the chart with testbed/chart-values.yaml and chart-pool-values.yaml
(testbed.chart_cluster): every component is the chart's pod (the plugin DaemonSet, the
controllers' Deployments), and the fabric is the chart's emulator, a pod too, which the
other pods reach at its Service's address (testbed.service_routes stands in for
kube-proxy). The nodes report the systemUUIDs of two hosts of the emulator's built-in
topology, as a real node reports its machine's, so the operator and the pool publisher
map them to the fabric's hosts.

The pool-only example's pod gets a GPU attached through the fabric and runs, and the
time from `helm install` to it Running is printed; then, released, that GPU stays on its
node as a local device, and the prefer-local example's pod there gets it with no fabric
call. The components' metrics are scraped from their pods' metrics ports at the pods'
addresses, and their logs read through the API (`pods/log`, served by the node's kubelet).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from pool_publisher.node_labels import own_label
from testbed import chart_cluster as cc
from testbed import examples
from testbed.cluster_view import CR_API
from testbed.controlplane import ControlPlane
from testbed.product_image import ProductImage
from testbed.realnode import RealNode
from testbed.realnode_pods import for_real_node
from testbed.realnodes import printed_gpus, started_nodes
from testbed.testimage import IMAGE
from testbed.wait import wait_for
from tests.e2e.test_chart_install import NAMESPACE, RELEASE, VALUES, sa_control_plane
from tests.e2e.test_real_node_network import product_image

pytestmark = pytest.mark.e2e
HOSTS = ("node-1", "node-2")  # zone-1 of the emulator's built-in topology reaches both
WORKLOADS = "pool-demo"
# Fixtures shared with those tests: found (or built) once, the image the nodes import is
# the one the chart names.
__all__ = ["product_image", "sa_control_plane"]


@pytest.fixture
def fabric_nodes(
    sa_control_plane: ControlPlane,
    node_bin_dir: Path,
    short_tmp: Path,
    unique: str,
    product_image: ProductImage,
) -> Iterator[list[RealNode]]:
    archive = [product_image.archive]
    names_ = [f"p{i}-{unique}" for i in (1, 2)]
    uuids = cc.host_uuids(HOSTS)
    with started_nodes(sa_control_plane, node_bin_dir, short_tmp, names_, archive, uuids) as made:
        yield made


def zone_1_selectors(kube: Kube) -> list[list[JSON]]:
    """The match expressions of each term of zone-1's pool slices."""
    return [
        term["matchExpressions"]
        for s in cc.pool_slices(kube)
        if s["spec"]["pool"]["name"] == f"{cc.FABRIC}/zone-1"
        for term in s["spec"]["nodeSelector"]["nodeSelectorTerms"]
    ]


def controller(kube: Kube, component: str) -> JSON:
    (pod,) = cc.component_pods(kube, component)
    return pod


def install(cp: ControlPlane, kube: Kube, nodes: list[RealNode], image: ProductImage) -> float:
    """`helm install`, the emulator routed, the pools published; the install's start."""
    assert (cc.RELEASE, cc.NAMESPACE, cc.VALUES) == (RELEASE, NAMESPACE, VALUES)
    t0 = time.monotonic()
    cc.helm_install(cp, image.tag, [cc.VALUES, cc.POOL_VALUES])
    route = cc.route_fabric(kube, nodes)
    address = cc.emulator_address()
    assert route.cluster_ip == address
    fabric = kube.get(path(CR_API, "fabrics", cc.FABRIC))
    assert fabric["spec"]["endpoint"] == f"http://{address}:8000"
    cc.wait_pools(kube, nodes)
    cc.workload_namespace(kube, WORKLOADS)
    return t0


def check_metrics_and_logs(kube: Kube, node: RealNode, gpu: str, cr: JSON) -> float:
    """Metrics from the pods' own metrics ports; logs through the API. The operator's
    fabric calls so far."""
    operator = cc.metrics_of(controller(kube, "operator"))
    assert operator[("composable_dra_fabric_reachable", (("fabric", cc.FABRIC),))] == 1
    fabric_calls = cc.total(operator, "composable_dra_fabric_operations_total")
    assert fabric_calls >= 1
    scaler = cc.metrics_of(controller(kube, "scaler"))
    assert cc.total(scaler, "composable_dra_time_to_gpu_seconds_count") == 1
    (plugin,) = [p for p in cc.component_pods(kube, "plugin") if p["spec"]["nodeName"] == node.name]
    prepared = cc.metrics_of(plugin)
    assert prepared[("composable_dra_plugin_prepare_seconds_count", (("result", "ok"),))] == 1

    plugin_log = cc.pod_log(kube, NAMESPACE, plugin["metadata"]["name"], "plugin")
    assert "registered with the kubelet" in plugin_log
    assert gpu in cc.pod_log(kube, WORKLOADS, "gpu-from-pool", "main")
    operator_pod = controller(kube, "operator")["metadata"]["name"]
    assert cr["metadata"]["name"] in cc.pod_log(kube, NAMESPACE, operator_pod, "operator")
    return fabric_calls


def test_a_pool_gpu_is_attached_to_a_chart_installed_node_and_its_pod_runs(
    fabric_nodes: list[RealNode], sa_control_plane: ControlPlane, product_image: ProductImage
) -> None:
    cp, nodes = sa_control_plane, fabric_nodes
    kube = Kube.from_config(str(cp.kubeconfig), user_agent="composable-dra/test-chart-pool")
    t0 = install(cp, kube, nodes, product_image)
    # With the chart's RBAC the publisher labels the zone's nodes, and its pool selects by
    # that one label (poolPublisher.labelNodes, the default).
    want = [{"key": own_label(cc.FABRIC, "zone-1").key, "operator": "In", "values": ["true"]}]
    wait_for(
        lambda: (sel := zone_1_selectors(kube)) != [] and all(t == want for t in sel),
        60,
        "zone-1's pool selecting by the publisher's label",
        describe=lambda: str(zone_1_selectors(kube)),
    )

    # A GPU of the pool, attached through the fabric to whichever node the scheduler picks.
    examples.apply(kube, "pool-only", WORKLOADS, pod=lambda p: for_real_node(p, None, IMAGE))
    pod = cc.wait_pod_running(kube, nodes, WORKLOADS, "gpu-from-pool")
    print(f"helm install -> first pod Running with a pool GPU: {time.monotonic() - t0:.1f}s")
    (node,) = [n for n in nodes if n.name == pod["spec"]["nodeName"]]
    gpu = printed_gpus(node, WORKLOADS, "gpu-from-pool")
    assert gpu in cc.fabric_gpus()
    (cr,) = cc.composable_resources(kube)
    assert (cr["spec"]["targetNode"], cr["status"]["phase"]) == (node.name, "Online")
    fabric_calls = check_metrics_and_logs(kube, node, gpu, cr)

    # Released, the GPU stays on the node as a local one: the next pod there gets it,
    # with no second attach.
    kube.delete(path("v1", "pods", "gpu-from-pool", namespace=WORKLOADS))
    claims = path("resource.k8s.io/v1", "resourceclaims", namespace=WORKLOADS)
    wait_for(
        lambda: gpu in cc.node_gpus(kube, node.name) and not kube.get(claims)["items"],
        60,
        f"{gpu} released and published as {node.name}'s own",
        interval=0.5,
    )
    local_pod = lambda p: for_real_node(p, node.name, IMAGE)  # noqa: E731
    examples.apply(kube, "prefer-local-fallback-pool", WORKLOADS, pod=local_pod)
    cc.wait_pod_running(kube, nodes, WORKLOADS, "gpu-prefer-local")
    assert printed_gpus(node, WORKLOADS, "gpu-prefer-local") == gpu
    assert len(cc.composable_resources(kube)) == 1
    operator = cc.metrics_of(controller(kube, "operator"))
    assert cc.total(operator, "composable_dra_fabric_operations_total") == fabric_calls
