"""A remote GPU lease through the installed chart, on two real nodes.

`helm install` with testbed/chart-values.yaml and chart-lend-values.yaml: the donor node
(labelled composable.dra.io/lend=true) runs the chart's plugin-lend DaemonSet pod, which
lends its GPU, and the donor DaemonSet's pod (host network, its lease API's certificate
for the node's address, from a Secret); the consumer node runs the plugin DaemonSet's
pod, with no GPU of its own. The plugin and the scaler reach the donor's lease API at the
address remoteGPU.donorApis names, trusting the CA that remoteGPU.donorCA mounts from a
ConfigMap. Every component is the chart's pod: none runs as a process.

A pod on the consumer whose claim asks for a remote GPU gets a lease from the donor's pod
(the claim's device status names the donor and its endpoint at the donor node's
address), and its process runs matmul there, each product checked against numpy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube
from testbed import chart_cluster as cc
from testbed import chart_lend as lend
from testbed.claims_seen import ClaimsSeen
from testbed.controlplane import ControlPlane
from testbed.product_image import ProductImage
from testbed.realnode import RealNode
from testbed.realnodes import started_nodes
from testbed.wait import wait_for
from tests.e2e.conftest import SeeClaims
from tests.e2e.test_chart_install import sa_control_plane
from tests.e2e.test_real_node_network import product_image
from tests.e2e.test_remote_lease import condition, device_status

pytestmark = pytest.mark.e2e
WORKLOADS = "lend-demo"
# Fixtures shared with those tests.
__all__ = ["product_image", "sa_control_plane"]


def one_pod_on(kube: Kube, component: str, node: RealNode) -> JSON:
    """The release's running pod of ``component`` on ``node``, once it runs."""
    return wait_for(
        lambda: next(
            (p for p in cc.component_pods(kube, component) if p["spec"]["nodeName"] == node.name),
            None,
        ),
        180,
        f"the chart's {component} pod on {node.name}",
        interval=0.5,
    )


@pytest.fixture
def lend_nodes(
    sa_control_plane: ControlPlane,
    node_bin_dir: Path,
    short_tmp: Path,
    unique: str,
    product_image: ProductImage,
) -> Iterator[tuple[RealNode, RealNode]]:
    """(donor, consumer): both in one network domain, the donor labelled to lend."""
    names_ = [f"d1-{unique}", f"u1-{unique}"]
    archive = [product_image.archive]
    with started_nodes(sa_control_plane, node_bin_dir, short_tmp, names_, archive) as made:
        donor, consumer = made
        lend.label_nodes(sa_control_plane.kube(), donor, [consumer])
        yield donor, consumer


def test_a_consumer_pod_computes_on_a_gpu_the_chart_installed_donor_lends(
    lend_nodes: tuple[RealNode, RealNode],
    sa_control_plane: ControlPlane,
    product_image: ProductImage,
    short_tmp: Path,
    claims_seen: SeeClaims,
) -> None:
    cp, (donor, consumer) = sa_control_plane, lend_nodes
    nodes = [donor, consumer]
    kube = Kube.from_config(str(cp.kubeconfig), user_agent="composable-dra/test-chart-lend")
    lend.donor_pki(kube, donor, short_tmp)
    t0 = time.monotonic()
    values = [cc.VALUES, lend.LEND_VALUES]
    cc.helm_install(cp, product_image.tag, values, lend.donor_api_flags(donor))
    # The lending plugin and the donor on the donor node only; the plain plugin elsewhere.
    donor_pod = one_pod_on(kube, "remote-gpu-donor", donor)
    assert donor_pod["status"]["podIP"] == lend.address(donor)  # host network
    one_pod_on(kube, "plugin-lend", donor)
    one_pod_on(kube, "plugin", consumer)
    assert [p["spec"]["nodeName"] for p in cc.component_pods(kube, "plugin-lend")] == [donor.name]
    assert [p["spec"]["nodeName"] for p in cc.component_pods(kube, "plugin")] == [consumer.name]
    lend.wait_remote_device(kube, nodes)

    cc.workload_namespace(kube, WORKLOADS)
    seen: ClaimsSeen = claims_seen(kube, WORKLOADS)
    run = lend.run_matmul(
        kube, WORKLOADS, consumer, product_image.ref, ["--size", "256", "--calls", "4"], nodes
    )
    print(f"helm install -> matmul done on the donor's GPU: {time.monotonic() - t0:.1f}s")
    out = run.out
    assert run.phase == "Succeeded", out
    ready = [c for c in seen.versions("matmul") if condition(c, "RemoteGPUReady")]
    assert ready, seen.versions("matmul")[-1:]
    data = (device_status(ready[-1]) or {})["data"]
    # The lease is the donor pod's, at its node's address; the pod's process computed there.
    assert data["donor"] == donor.name
    assert data["endpoint"].startswith(f"{lend.address(donor)}:{lend.DATA_PORT}"), data
    assert out["ok"] is True and out["where"] == "remote", out
    assert out["lease"] == data["lease"] and out["calls"] == 4
    donor_metrics = cc.metrics_of(donor_pod, port=9470)
    assert cc.total(donor_metrics, "remote_gpu_leases_opened_total") >= 1
    assert "lease" in cc.pod_log(kube, cc.NAMESPACE, donor_pod["metadata"]["name"], "donor")
