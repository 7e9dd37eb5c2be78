"""A GPU from the fabric's pool through the installed chart, on two real nodes.

`helm install` of the chart with testbed/chart-values.yaml and chart-pool-values.yaml:
every component is the chart's pod (the plugin DaemonSet, the controllers' Deployments),
and the fabric is the chart's emulator, a pod too, which the other pods reach at its
Service's address (testbed.service_routes stands in for kube-proxy). The nodes report the
systemUUIDs of two hosts of the emulator's built-in topology, as a real node reports its
machine's, so the operator and the pool publisher map them to the fabric's hosts.

The pool-only example's pod gets a GPU attached through the fabric and runs, and the
time from `helm install` to it Running is printed; then, released, that GPU stays on its
node as a local device, and the prefer-local example's pod there gets it with no fabric
call. The components' metrics are scraped from their pods' metrics ports at the pods'
addresses, and their logs read through the API (`pods/log`, served by the node's kubelet).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from fabric_emulator.topology import default as default_topology
from testbed import chart, examples
from testbed.cluster_view import CR_API
from testbed.controlplane import ControlPlane
from testbed.product_image import find_product_image
from testbed.realnode import RealNode
from testbed.realnode_pods import for_real_node
from testbed.realnodes import printed_gpus, started_nodes
from testbed.service_routes import route_service
from testbed.testimage import IMAGE
from testbed.wait import wait_for
from tests.e2e.test_chart_install import (
    NAMESPACE,
    RELEASE,
    VALUES,
    pods_of,
    running,
    sa_control_plane,
)

pytestmark = pytest.mark.e2e
POOL_VALUES = chart.ROOT / "testbed" / "chart-pool-values.yaml"
HOSTS = ("node-1", "node-2")  # zone-1 of the emulator's built-in topology reaches both
WORKLOADS = "pool-demo"
EMULATOR = f"{RELEASE}-composable-dra-fabric-emulator"
__all__ = ["sa_control_plane"]  # the fixture, shared with test_chart_install


@pytest.fixture
def fabric_nodes(
    sa_control_plane: ControlPlane, node_bin_dir: Path, short_tmp: Path, unique: str
) -> Iterator[list[RealNode]]:
    hosts = default_topology().hosts
    uuids = [hosts[host].uuid for host in HOSTS]
    archive = [find_product_image().archive]
    names_ = [f"p{i}-{unique}" for i in (1, 2)]
    with started_nodes(sa_control_plane, node_bin_dir, short_tmp, names_, archive, uuids) as made:
        yield made


def metrics_of(pod: JSON, port: int = 9090) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The pod's metrics, scraped at its own address (the host routes each node's pod
    network), by sample name and sorted labels."""
    url = f"http://{pod['status']['podIP']}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    """The sum of the samples named ``name`` over every label set."""
    return sum(v for (n, _), v in metrics.items() if n == name)


def pod_log(kube: Kube, namespace: str, pod: str, container: str) -> str:
    """A container's log through the API server (pods/log: the node's kubelet serves it)."""
    core = client.CoreV1Api(kube.api)
    return str(core.read_namespaced_pod_log(pod, namespace, container=container))


def controller(kube: Kube, component: str) -> JSON:
    (pod,) = running(pods_of(kube, component))
    return pod


def workload_ready(kube: Kube) -> bool:
    """The workloads' namespace and its default ServiceAccount (the ServiceAccount
    admission plugin refuses pods before it exists)."""
    sa = kube.get_or_none(path("v1", "serviceaccounts", "default", namespace=WORKLOADS))
    return sa is not None


def running_pod(kube: Kube, nodes: list[RealNode], name: str, describe: object) -> JSON:
    pod_path = path("v1", "pods", name, namespace=WORKLOADS)

    def up() -> JSON | None:
        for node in nodes:
            node.check_alive()
        got: JSON = kube.get(pod_path)
        assert got["status"].get("phase") not in ("Failed", "Succeeded"), got["status"]
        return got if got["status"].get("phase") == "Running" else None

    return wait_for(up, 180, f"pod {name} to run", interval=0.2, describe=describe)  # type: ignore[arg-type]


def test_a_pool_gpu_is_attached_to_a_chart_installed_node_and_its_pod_runs(
    fabric_nodes: list[RealNode], sa_control_plane: ControlPlane
) -> None:
    cp, nodes = sa_control_plane, fabric_nodes
    kube = Kube.from_config(str(cp.kubeconfig), user_agent="composable-dra/test-chart-pool")
    image = find_product_image()
    fabric_gpus = {b.redfish_uuid for b in default_topology().blocks.values()}

    def describe() -> str:
        pods = kube.get(path("v1", "pods"))["items"]
        states = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"]) for p in pods]
        crs = kube.get(path(CR_API, "composableresources"))["items"]
        logs = [
            f"--- {p['metadata']['name']}/{c['name']} ---\n"
            + "\n".join(
                n.container_log(p["metadata"]["namespace"], p["metadata"]["name"], c["name"])[
                    -2000:
                ]
                for n in nodes
            )
            for p in pods
            for c in p["spec"]["containers"]
        ]
        return "\n".join([*(str(s) for s in states), str(crs), *logs])

    t0 = time.monotonic()
    chart.helm(
        "install",
        RELEASE,
        str(chart.CHART),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--kubeconfig",
        str(cp.kubeconfig),
        "--values",
        str(VALUES),
        "--values",
        str(POOL_VALUES),
        "--set",
        f"image.tag={image.tag}",
    )
    clusterip = yaml.safe_load(POOL_VALUES.read_text())["emulator"]["clusterIP"]
    route = route_service(kube, nodes, NAMESPACE, EMULATOR)
    assert route.cluster_ip == clusterip
    fabric = kube.get(path(CR_API, "fabrics", "default"))
    assert fabric["spec"]["endpoint"] == f"http://{clusterip}:8000"

    def pools() -> list[JSON] | None:
        got: list[JSON] = kube.get(
            path("resource.k8s.io/v1", "resourceslices"),
            labelSelector=f"{names.LABEL_FABRIC}=default",
        )["items"]
        return got or None

    wait_for(pools, 180, "the chart's pool publisher to publish the fabric's pools", 0.5, describe)
    kube.create(path("v1", "namespaces"), {"metadata": {"name": WORKLOADS}})
    wait_for(lambda: workload_ready(kube), 60, "the workloads' default ServiceAccount")

    # A GPU of the pool, attached through the fabric to whichever node the scheduler picks.
    examples.apply(kube, "pool-only", WORKLOADS, pod=lambda p: for_real_node(p, None, IMAGE))
    pod = running_pod(kube, nodes, "gpu-from-pool", describe)
    first_gpu_s = time.monotonic() - t0
    print(f"helm install -> first pod Running with a pool GPU: {first_gpu_s:.1f}s", flush=True)
    (node,) = [n for n in nodes if n.name == pod["spec"]["nodeName"]]
    gpu = printed_gpus(node, WORKLOADS, "gpu-from-pool")
    assert gpu.removeprefix("GPU-") in fabric_gpus
    (cr,) = kube.get(path(CR_API, "composableresources"))["items"]
    assert (cr["spec"]["targetNode"], cr["status"]["phase"]) == (node.name, "Online")

    # Metrics from the pods' own metrics ports, at their pod addresses.
    operator = metrics_of(controller(kube, "operator"))
    assert operator[("composable_dra_fabric_reachable", (("fabric", "default"),))] == 1
    fabric_calls = sample(operator, "composable_dra_fabric_operations_total")
    assert fabric_calls >= 1
    assert (
        sample(metrics_of(controller(kube, "scaler")), "composable_dra_time_to_gpu_seconds_count")
        == 1
    )
    (plugin,) = [p for p in running(pods_of(kube, "plugin")) if p["spec"]["nodeName"] == node.name]
    prepared = metrics_of(plugin)
    assert prepared[("composable_dra_plugin_prepare_seconds_count", (("result", "ok"),))] == 1

    # Logs through the API, from each node's kubelet.
    assert "registered with the kubelet" in pod_log(
        kube, NAMESPACE, plugin["metadata"]["name"], "plugin"
    )
    assert gpu in pod_log(kube, WORKLOADS, "gpu-from-pool", "main")
    operator_log = pod_log(
        kube, NAMESPACE, controller(kube, "operator")["metadata"]["name"], "operator"
    )
    assert cr["metadata"]["name"] in operator_log

    # Released, the GPU stays on the node as a local one: the next pod there gets it,
    # with no second attach.
    kube.delete(path("v1", "pods", "gpu-from-pool", namespace=WORKLOADS))

    def local() -> bool:
        slices = kube.get(
            path("resource.k8s.io/v1", "resourceslices"),
            fieldSelector=f"spec.nodeName={node.name},spec.driver={names.DRIVER}",
        )["items"]
        claims = kube.get(path("resource.k8s.io/v1", "resourceclaims", namespace=WORKLOADS))
        uuids = {
            d["attributes"].get("uuid", {}).get("string")
            for s in slices
            for d in s["spec"].get("devices", [])
        }
        return gpu in uuids and not claims["items"]

    wait_for(local, 60, f"{gpu} released and published as {node.name}'s own", 0.5, describe)
    examples.apply(
        kube,
        "prefer-local-fallback-pool",
        WORKLOADS,
        pod=lambda p: for_real_node(p, node.name, IMAGE),
    )
    running_pod(kube, nodes, "gpu-prefer-local", describe)
    assert printed_gpus(node, WORKLOADS, "gpu-prefer-local") == gpu
    assert len(kube.get(path(CR_API, "composableresources"))["items"]) == 1
    operator = metrics_of(controller(kube, "operator"))
    assert sample(operator, "composable_dra_fabric_operations_total") == fabric_calls
