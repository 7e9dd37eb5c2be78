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

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from dra_driver.slices import NETWORK_DOMAIN_LABEL
from testbed import chart_cluster as cc
from testbed.chart import ROOT
from testbed.claims_seen import ClaimsSeen
from testbed.controlplane import ControlPlane
from testbed.pki import CertificateAuthority
from testbed.product_image import ProductImage
from testbed.realnode import RealNode
from testbed.realnode_pods import for_real_node
from testbed.realnodes import started_nodes
from testbed.remote_pods import matmul_claim_and_pod
from testbed.wait import wait_for
from tests.e2e.conftest import SeeClaims
from tests.e2e.test_chart_install import sa_control_plane
from tests.e2e.test_real_node_network import product_image
from tests.e2e.test_remote_lease import condition, device_status

pytestmark = pytest.mark.e2e
LEND_VALUES = ROOT / "testbed" / "chart-lend-values.yaml"
LEND_LABEL = "composable.dra.io/lend"
WORKLOADS = "lend-demo"
API_PORT, DATA_PORT = 7471, 7470  # the chart's remoteGPU.donor ports
CLASS = "composable-gpu"  # the chart's DeviceClass
# Fixtures shared with those tests.
__all__ = ["product_image", "sa_control_plane"]


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
        kube = sa_control_plane.kube()
        donor, consumer = made
        for node, labels in ((donor, {LEND_LABEL: "true"}), (consumer, {})):
            labels[NETWORK_DOMAIN_LABEL] = "chart-lab"
            kube.merge_patch(path("v1", "nodes", node.name), {"metadata": {"labels": labels}})
        yield donor, consumer


def address(node: RealNode) -> str:
    """The node's InternalIP (its end of its network's veth pair)."""
    assert node.network is not None, f"{node.name} is not started"
    return node.network.node_ip


def donor_pki(kube: Kube, donor: RealNode, workdir: Path) -> None:
    """The donor's lease API certificate for its node's address (a Secret), and the CA
    that signed it (a ConfigMap), in the release namespace, before the install."""
    ca = CertificateAuthority(workdir / "pki")
    tls = ca.issue("donor", donor.name, ips=(address(donor),), server=True)
    kube.create(path("v1", "namespaces"), {"metadata": {"name": cc.NAMESPACE}})
    secrets = path("v1", "secrets", namespace=cc.NAMESPACE)
    string_data = {"tls.crt": tls.cert.read_text(), "tls.key": tls.key.read_text()}
    tls_secret = {"metadata": {"name": "donor-tls"}, "type": "kubernetes.io/tls"}
    kube.create(secrets, {**tls_secret, "stringData": string_data})
    config_maps = path("v1", "configmaps", namespace=cc.NAMESPACE)
    ca_data = {"ca.crt": ca.cert_path.read_text()}
    kube.create(config_maps, {"metadata": {"name": "donor-ca"}, "data": ca_data})


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


def wait_remote_device(kube: Kube, donor: RealNode, nodes: list[RealNode]) -> None:
    """The donor's plugin-lend pod publishes its GPU as a remote device."""

    def published() -> bool:
        slices = kube.get(path("resource.k8s.io/v1", "resourceslices"))["items"]
        devices = [d for s in slices for d in s["spec"].get("devices", [])]
        return any(d["name"].endswith("-remote") for d in devices)

    wait_for(published, 180, f"{donor.name}'s remote device", 0.5, lambda: cc.describe(kube, nodes))


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
    donor_pki(kube, donor, short_tmp)
    t0 = time.monotonic()
    api = json.dumps({donor.name: f"https://{address(donor)}:{API_PORT}"})
    cc.helm_install(
        cp,
        product_image.tag,
        [cc.VALUES, LEND_VALUES],
        ["--set-json", f"remoteGPU.donorApis={api}"],
    )
    # The lending plugin and the donor on the donor node only; the plain plugin elsewhere.
    donor_pod = one_pod_on(kube, "remote-gpu-donor", donor)
    assert donor_pod["status"]["podIP"] == address(donor)  # host network
    one_pod_on(kube, "plugin-lend", donor)
    one_pod_on(kube, "plugin", consumer)
    assert [p["spec"]["nodeName"] for p in cc.component_pods(kube, "plugin-lend")] == [donor.name]
    assert [p["spec"]["nodeName"] for p in cc.component_pods(kube, "plugin")] == [consumer.name]
    wait_remote_device(kube, donor, nodes)

    cc.workload_namespace(kube, WORKLOADS)
    seen: ClaimsSeen = claims_seen(kube, WORKLOADS)
    out = run_matmul(kube, consumer, product_image.ref, nodes)
    print(f"helm install -> matmul done on the donor's GPU: {time.monotonic() - t0:.1f}s")
    ready = [c for c in seen.versions("matmul") if condition(c, "RemoteGPUReady")]
    assert ready, seen.versions("matmul")[-1:]
    data = (device_status(ready[-1]) or {})["data"]
    # The lease is the donor pod's, at its node's address; the pod's process computed there.
    assert data["donor"] == donor.name
    assert data["endpoint"].startswith(f"{address(donor)}:{DATA_PORT}"), data
    assert out["ok"] is True and out["where"] == "remote", out
    assert out["lease"] == data["lease"] and out["calls"] == 4
    donor_metrics = cc.metrics_of(donor_pod, port=9470)
    assert cc.total(donor_metrics, "remote_gpu_leases_opened_total") >= 1
    assert "lease" in cc.pod_log(kube, cc.NAMESPACE, donor_pod["metadata"]["name"], "donor")


def run_matmul(kube: Kube, consumer: RealNode, image: str, nodes: list[RealNode]) -> JSON:
    """The matmul workload in a pod on ``consumer`` with a claim for a remote GPU; its
    last line once it ended."""
    command = ["python3", "-m", "remote_gpu.workloads.matmul", "--size", "256", "--calls", "4"]
    claim, pod = matmul_claim_and_pod("matmul", consumer.name, [], CLASS)
    pod["spec"]["containers"][0]["command"] = command
    pod = for_real_node(pod, consumer.name, image)
    # The lease's token file is the plugin's (root, 0400).
    pod["spec"]["securityContext"] = {"runAsUser": 0}
    kube.create(path("resource.k8s.io/v1", "resourceclaims", namespace=WORKLOADS), claim)
    kube.create(path("v1", "pods", namespace=WORKLOADS), pod)
    pod_path = path("v1", "pods", "matmul", namespace=WORKLOADS)
    wait_for(
        lambda: kube.get(pod_path)["status"].get("phase") in ("Succeeded", "Failed"),
        120,
        "the matmul pod to finish",
        interval=0.5,
        describe=lambda: cc.describe(kube, nodes),
    )
    log = cc.pod_log(kube, WORKLOADS, "matmul", "main")
    assert kube.get(pod_path)["status"]["phase"] == "Succeeded", log
    out: JSON = json.loads(log.strip().splitlines()[-1])
    return out
