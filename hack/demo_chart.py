"""`make demo DEMO_ARGS=--chart`: the demo's cluster with the product installed by its Helm
chart, as a platform engineer installs it, instead of each component as a process.

Three real nodes (the upstream kubelet with containerd and runc, each with its own network
namespace and pod network; testbed/realnode.py), carrying the systemUUIDs of the fabric
emulator's three hosts, with the product's image (hack/image/build.sh) imported into each
containerd; then `helm install` of deploy/helm/composable-dra with
testbed/chart-values.yaml and chart-pool-values.yaml (testbed/chart_cluster.py): the
plugin DaemonSet, the operator, pool publisher and scaler Deployments and the chart's
fabric emulator, all pods. :class:`ChartSuite` answers what the demo asks of its cluster,
as testbed.harness.Suite does for the processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from composable_dra.k8s.kube import JSON, Kube, path
from testbed import chart_cluster as cc
from testbed.controlplane import ControlPlane
from testbed.product_image import find_product_image
from testbed.realnode import RealNode
from testbed.realnodes import started_nodes
from testbed.wait import wait_for

HOSTS = ("node-1", "node-2", "node-3")  # the emulator's built-in topology


@dataclass
class ChartSuite:
    """The chart-installed cluster, read as the demo reads testbed.harness.Suite."""

    kube: Kube
    nodes: list[RealNode]
    image: str
    real_nodes: dict[str, RealNode] = field(default_factory=dict)

    def resources(self) -> list[JSON]:
        return cc.composable_resources(self.kube)

    def pool_slices(self) -> list[JSON]:
        return cc.pool_slices(self.kube)

    def pod(self, namespace: str, name: str) -> JSON:
        got: JSON = self.kube.get(path("v1", "pods", name, namespace=namespace))
        return got

    def running(self, namespace: str, name: str) -> bool:
        got = self.kube.get_or_none(path("v1", "pods", name, namespace=namespace))
        return bool(got and got.get("status", {}).get("phase") == "Running")

    def describe(self) -> str:
        return cc.describe(self.kube, self.nodes)

    def stop_scaler(self) -> None:
        """The chart's scaler scaled to none (the lending lab runs a scaler of its own)."""
        name = f"{cc.RELEASE}-composable-dra-scaler"
        scaler = path("apps/v1", "deployments", name, namespace=cc.NAMESPACE)
        self.kube.merge_patch(scaler, {"spec": {"replicas": 0}})
        wait_for(lambda: not cc.component_pods(self.kube, "scaler"), 60, "the scaler pod to go")


@contextlib.contextmanager
def chart_suite(
    cp: ControlPlane,
    kube: Kube,
    bin_dir: Path,
    workdir: Path,
    idle_seconds: float,
    line: Callable[[str], None],
) -> Iterator[ChartSuite]:
    """Three real nodes, the chart installed on them, its pools published; all stopped at
    the end (the nodes take the chart's pods with them)."""
    image = find_product_image()
    line(f"image {image.ref} ({image.archive})")
    names_ = [f"{h}-demo" for h in HOSTS]
    uuids = cc.host_uuids(HOSTS)
    with started_nodes(cp, bin_dir, workdir, names_, [image.archive], uuids) as nodes:
        idle = f'scaler.extraArgs=["--no-removal-duration={idle_seconds:g}"]'
        cc.helm_install(cp, image.tag, [cc.VALUES, cc.POOL_VALUES], ["--set-json", idle])
        line(f"helm install {cc.RELEASE} deploy/helm/composable-dra -n {cc.NAMESPACE}")
        route = cc.route_fabric(kube, nodes)
        line(f"the chart's fabric emulator at http://{route.cluster_ip}:{route.port}")
        cc.wait_pools(kube, nodes)
        suite = ChartSuite(kube, nodes, image.ref, dict(zip(HOSTS, nodes, strict=True)))
        yield suite
