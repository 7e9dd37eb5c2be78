"""The product installed by its Helm chart on real nodes, with the chart's fabric emulator:
what tests/e2e/test_chart_pool.py and `make demo DEMO_ARGS=--chart` (testbed.chart_demo)
share.

`helm install` with testbed/chart-values.yaml and chart-pool-values.yaml; the emulator's
Service routed on each node (testbed.service_routes, as kube-proxy would); the nodes
carry the systemUUIDs of the emulator's built-in hosts (:func:`host_uuids`), so the
operator and the pool publisher map them to the fabric. The components' metrics are read
at their pods' addresses and their logs through the API (``pods/log``).
:class:`ChartSuite` answers what the demo asks of its cluster, as testbed.harness.Suite
does for the components as processes.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from fabric_emulator.topology import default as default_topology
from testbed import chart
from testbed.cluster_view import CR_API
from testbed.controlplane import ControlPlane
from testbed.realnode import RealNode
from testbed.service_routes import ServiceRoute, route_service
from testbed.wait import wait_for

RELEASE = "cdra"
NAMESPACE = "composable-dra"
VALUES = chart.ROOT / "testbed" / "chart-values.yaml"
POOL_VALUES = chart.ROOT / "testbed" / "chart-pool-values.yaml"
FABRIC = "default"  # the chart's Fabric (fabric.name)
EMULATOR = f"{RELEASE}-composable-dra-fabric-emulator"
METRICS_PORT = 9090  # every component's, as the chart sets it

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def host_uuids(hosts: Sequence[str]) -> list[str]:
    """The systemUUIDs of ``hosts`` of the emulator's built-in topology."""
    known = default_topology().hosts
    return [known[h].uuid for h in hosts]


def fabric_gpus() -> set[str]:
    """Every GPU UUID of the built-in topology, as the plugin publishes it."""
    return {b.redfish_uuid for b in default_topology().blocks.values()}


def helm_install(
    cp: ControlPlane, image_tag: str, values: Sequence[Path], extra: Sequence[str] = ()
) -> None:
    """`helm install` of the release with ``values`` files and ``extra`` flags."""
    args = ["install", RELEASE, str(chart.CHART), "--namespace", NAMESPACE, "--create-namespace"]
    args += ["--kubeconfig", str(cp.kubeconfig), "--set", f"image.tag={image_tag}"]
    for f in values:
        args += ["--values", str(f)]
    chart.helm(*args, *extra)


def emulator_address() -> str:
    return str(yaml.safe_load(POOL_VALUES.read_text())["emulator"]["clusterIP"])


def route_fabric(kube: Kube, nodes: Sequence[RealNode]) -> ServiceRoute:
    """Once the chart's emulator pod is ready, its Service's address routed on ``nodes``."""
    return route_service(kube, nodes, NAMESPACE, EMULATOR, timeout=180)


def pool_slices(kube: Kube) -> list[JSON]:
    items: list[JSON] = kube.get(
        path("resource.k8s.io/v1", "resourceslices"),
        labelSelector=f"{names.LABEL_FABRIC}={FABRIC}",
    )["items"]
    return items


def node_gpus(kube: Kube, node: str) -> set[str]:
    """The GPU UUIDs the node's plugin publishes."""
    slices = kube.get(
        path("resource.k8s.io/v1", "resourceslices"),
        fieldSelector=f"spec.nodeName={node},spec.driver={names.DRIVER}",
    )["items"]
    attrs = [d.get("attributes", {}) for s in slices for d in s["spec"].get("devices", [])]
    return {a["uuid"]["string"] for a in attrs if "uuid" in a}


def composable_resources(kube: Kube) -> list[JSON]:
    items: list[JSON] = kube.get(path(CR_API, "composableresources"))["items"]
    return items


def component_pods(kube: Kube, component: str) -> list[JSON]:
    """The release's running pods of ``component`` (plugin, operator, scaler...)."""
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
    pods = kube.get(path("v1", "pods", namespace=NAMESPACE), labelSelector=selector)["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"]


def metrics_of(pod: JSON, port: int = METRICS_PORT) -> Samples:
    """The pod's metrics, scraped at its own address (the host routes each node's pod
    network: testbed.node_network), by sample name and sorted labels."""
    url = f"http://{pod['status']['podIP']}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str) -> float:
    """The sum of the samples named ``name`` over every label set."""
    return sum(v for (n, _), v in samples.items() if n == name)


def pod_log(kube: Kube, namespace: str, pod: str, container: str) -> str:
    """A container's log through the API server (pods/log: the node's kubelet serves it)."""
    core = client.CoreV1Api(kube.api)
    return str(core.read_namespaced_pod_log(pod, namespace, container=container))


def describe(kube: Kube, nodes: Sequence[RealNode]) -> str:
    """Every pod's state and the tail of each container's log, and the resources."""
    pods = kube.get(path("v1", "pods"))["items"]
    lines = [str((p["metadata"]["name"], p["spec"].get("nodeName"), p["status"])) for p in pods]
    lines.append(str(composable_resources(kube)))
    for p in pods:
        meta = p["metadata"]
        for c in p["spec"]["containers"]:
            out = "".join(
                n.container_log(meta["namespace"], meta["name"], c["name"]) for n in nodes
            )
            lines.append(f"--- {meta['name']}/{c['name']} ---\n{out[-2000:]}")
    return "\n".join(lines)


def wait_pools(kube: Kube, nodes: Sequence[RealNode], timeout: float = 180) -> list[JSON]:
    return wait_for(
        lambda: pool_slices(kube),
        timeout,
        "the chart's pool publisher to publish the fabric's pools",
        interval=0.5,
        describe=lambda: describe(kube, nodes),
    )


def wait_pod_running(
    kube: Kube, nodes: Sequence[RealNode], namespace: str, name: str, timeout: float = 180
) -> JSON:
    pod_path = path("v1", "pods", name, namespace=namespace)

    def up() -> JSON | None:
        for node in nodes:
            node.check_alive()
        got: JSON = kube.get(pod_path)
        assert got["status"].get("phase") not in ("Failed", "Succeeded"), got["status"]
        return got if got["status"].get("phase") == "Running" else None

    return wait_for(
        up, timeout, f"pod {namespace}/{name} to run", 0.2, lambda: describe(kube, nodes)
    )


def workload_namespace(kube: Kube, name: str) -> None:
    """A namespace for workloads, once its default ServiceAccount exists (the
    ServiceAccount admission plugin refuses pods before)."""
    kube.create(path("v1", "namespaces"), {"metadata": {"name": name}})
    sa = path("v1", "serviceaccounts", "default", namespace=name)
    wait_for(lambda: kube.get_or_none(sa), 60, f"the default ServiceAccount of {name}")


@dataclass
class ChartSuite:
    """The chart-installed cluster, read as the demo reads testbed.harness.Suite."""

    kube: Kube
    nodes: list[RealNode]
    image: str
    real_nodes: dict[str, RealNode] = field(default_factory=dict)

    def resources(self) -> list[JSON]:
        return composable_resources(self.kube)

    def pool_slices(self) -> list[JSON]:
        return pool_slices(self.kube)

    def pod(self, namespace: str, name: str) -> JSON:
        got: JSON = self.kube.get(path("v1", "pods", name, namespace=namespace))
        return got

    def running(self, namespace: str, name: str) -> bool:
        got = self.kube.get_or_none(path("v1", "pods", name, namespace=namespace))
        return bool(got and got.get("status", {}).get("phase") == "Running")

    def describe(self) -> str:
        return describe(self.kube, self.nodes)
