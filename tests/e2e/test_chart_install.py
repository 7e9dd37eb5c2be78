"""`helm install` of the chart (deploy/helm/composable-dra) on two real nodes, with the
product image (hack/image/build.sh) imported into their containerd and the values kept in
testbed/chart-values.yaml: every component runs as the chart's pod, nothing as a process.

The plugin DaemonSet's pod runs on each node and registers with that node's kubelet
through the chart's hostPath volumes (its registration socket in the kubelet's
plugins_registry, its log), and publishes the node's ResourceSlice; the pool publisher,
scaler and operator Deployments run with the chart's service accounts and each holds its
leader Lease. The time from `helm install` to all of it is printed.

The control plane is the test's own: it admits pods with the ServiceAccount admission
plugin, so the chart's pods get their service accounts' tokens, as in a cluster.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from testbed import chart
from testbed.controlplane import ControlPlane, find_binaries
from testbed.product_image import ProductImage, find_product_image
from testbed.realnode import RealNode
from testbed.realnodes import started_nodes
from testbed.wait import wait_for

pytestmark = pytest.mark.e2e
VALUES = chart.ROOT / "testbed" / "chart-values.yaml"
RELEASE = "cdra"
NAMESPACE = "composable-dra"
CONTROLLERS = ("pool-publisher", "scaler", "operator")


@pytest.fixture(scope="module")
def sa_control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    workdir = tmp_path_factory.mktemp("cp-chart")
    with ControlPlane(find_binaries(), workdir=workdir, service_account_admission=True) as cp:
        yield cp


@pytest.fixture
def nodes(
    sa_control_plane: ControlPlane, node_bin_dir: Path, short_tmp: Path, unique: str
) -> Iterator[list[RealNode]]:
    image = find_product_image()
    names_ = [f"c{i}-{unique}" for i in (1, 2)]
    with started_nodes(sa_control_plane, node_bin_dir, short_tmp, names_, [image.archive]) as made:
        yield made


def pods_of(kube: Kube, component: str) -> list[JSON]:
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
    items: list[JSON] = kube.get(path("v1", "pods", namespace=NAMESPACE), labelSelector=selector)[
        "items"
    ]
    return items


def running(pods: list[JSON]) -> list[JSON]:
    return [p for p in pods if p["status"].get("phase") == "Running"]


def static_uuids() -> set[str]:
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    return {d["uuid"] for d in values["plugin"]["static"]["devices"]}


def node_slice_devices(kube: Kube, node: str) -> set[str]:
    """The GPU UUIDs in the node's slices of our driver."""
    slices = kube.get(
        path("resource.k8s.io/v1", "resourceslices"),
        fieldSelector=f"spec.nodeName={node},spec.driver={names.DRIVER}",
    )["items"]
    devices = [d for s in slices for d in s["spec"].get("devices", [])]
    return {d["attributes"]["uuid"]["string"] for d in devices if "uuid" in d.get("attributes", {})}


def plugin_registered(node: RealNode, kube: Kube) -> bool:
    """The node's plugin pod runs, the kubelet registered it (its log says so, its
    registration socket is in the kubelet's plugins_registry) and its slice is up."""
    node.check_alive()
    pods = [p for p in running(pods_of(kube, "plugin")) if p["spec"]["nodeName"] == node.name]
    if not pods:
        return False
    (pod,) = pods
    log = node.container_log(NAMESPACE, pod["metadata"]["name"], "plugin")
    uid = pod["metadata"]["uid"]
    socket = node.plugins_registry_dir / f"{names.DRIVER}-{uid}-reg.sock"
    return (
        "registered with the kubelet" in log
        and socket.exists()
        and static_uuids() <= node_slice_devices(kube, node.name)
    )


def leaders(kube: Kube) -> dict[str, str]:
    """Each controller's Lease holder, by component, where it names one of its pods."""
    held = {}
    leases = kube.get(path("coordination.k8s.io/v1", "leases", namespace=NAMESPACE))["items"]
    holders = {str(lease["spec"].get("holderIdentity") or "") for lease in leases}
    for component in CONTROLLERS:
        for pod in running(pods_of(kube, component)):
            if any(h.startswith(pod["metadata"]["name"]) for h in holders):
                held[component] = pod["metadata"]["name"]
    return held


def test_helm_install_runs_every_component_as_the_charts_pods(
    nodes: list[RealNode], sa_control_plane: ControlPlane
) -> None:
    cp = sa_control_plane
    kube = Kube.from_config(str(cp.kubeconfig), user_agent="composable-dra/test-chart-install")
    image: ProductImage = find_product_image()
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
        "--set",
        f"image.tag={image.tag}",
    )

    def describe() -> str:
        pods = kube.get(path("v1", "pods", namespace=NAMESPACE))["items"]
        states = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"]) for p in pods]
        logs = [
            f"--- {p['metadata']['name']} ---\n"
            + "\n".join(
                n.container_log(NAMESPACE, p["metadata"]["name"], c["name"])[-3000:]
                for n in nodes
                for c in p["spec"]["containers"]
            )
            for p in pods
        ]
        return "\n".join([*(str(s) for s in states), *logs, *(n.logs_tail(10) for n in nodes)])

    for node in nodes:
        wait_for(
            functools.partial(plugin_registered, node, kube),
            240,
            f"the chart's plugin pod on {node.name} to register and publish",
            interval=0.5,
            describe=describe,
        )
    registered_s = time.monotonic() - t0

    def all_lead() -> dict[str, str] | None:
        got = leaders(kube)
        return got if len(got) == len(CONTROLLERS) else None

    held = wait_for(
        all_lead,
        240,
        "each controller's pod to run and hold its leader Lease",
        interval=0.5,
        describe=describe,
    )
    all_s = time.monotonic() - t0
    print(
        f"helm install -> plugin pods registered on {len(nodes)} nodes: {registered_s:.1f}s; "
        f"-> every controller leading: {all_s:.1f}s ({held})"
    )
    for component in CONTROLLERS:
        (pod,) = running(pods_of(kube, component))
        assert pod["spec"]["serviceAccountName"] == f"{RELEASE}-composable-dra-{component}"
        assert pod["spec"]["containers"][0]["image"] == image.ref
