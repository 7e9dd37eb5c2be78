"""A remote GPU lease through the installed chart, on real nodes
(tests/e2e/test_chart_lend.py).

The donor node is labelled to lend (:data:`LEND_LABEL`) and put in one network domain
with its borrowers; the donor's lease API certificate (for its node's address, node names
not resolving here) and the CA that signed it are created in the release namespace before
`helm install` with testbed/chart-lend-values.yaml and :func:`donor_api_flags`. The
matmul workload then runs in a pod of the product's image (Python, numpy) on a borrower.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from composable_dra.k8s.kube import JSON, Conflict, Kube, path
from composable_dra.lending.remote_leases import REMOTE_READY
from dra_driver.slices import NETWORK_DOMAIN_LABEL
from testbed import chart_cluster as cc
from testbed.chart import ROOT
from testbed.pki import CertificateAuthority
from testbed.realnode import RealNode
from testbed.realnode_pods import for_real_node
from testbed.remote_pods import matmul_claim_and_pod
from testbed.wait import wait_for

LEND_VALUES = ROOT / "testbed" / "chart-lend-values.yaml"
LEND_LABEL = "composable.dra.io/lend"
DOMAIN = "chart-lab"
API_PORT, DATA_PORT = 7471, 7470  # the chart's remoteGPU.donor ports
CLASS = "composable-gpu"  # the chart's DeviceClass
RESOURCE = "resource.k8s.io/v1"


def address(node: RealNode) -> str:
    """The node's InternalIP (its end of its network's veth pair)."""
    assert node.network is not None, f"{node.name} is not started"
    return node.network.node_ip


def label_nodes(kube: Kube, donor: RealNode, borrowers: Sequence[RealNode]) -> None:
    """The donor labelled to lend and tainted for the lenders' pods only (the chart's
    plugin and donor pods tolerate it: chart-lend-values.yaml), so that no other pod
    lands there and takes its GPU as a local one; it and the borrowers in one network
    domain."""
    kube.merge_patch(
        path("v1", "nodes", donor.name), {"metadata": {"labels": {LEND_LABEL: "true"}}}
    )
    for node in (donor, *borrowers):
        join_domain(kube, node)
    taints = kube.get(path("v1", "nodes", donor.name))["spec"].get("taints") or []
    taint = {"key": LEND_LABEL, "value": "true", "effect": "NoSchedule"}
    kube.merge_patch(path("v1", "nodes", donor.name), {"spec": {"taints": [*taints, taint]}})


def join_domain(kube: Kube, node: RealNode) -> None:
    """``node`` in the lending network domain: a remote device's node selector admits it
    from then on."""
    labels = {NETWORK_DOMAIN_LABEL: DOMAIN}
    kube.merge_patch(path("v1", "nodes", node.name), {"metadata": {"labels": labels}})


def donor_pki(kube: Kube, donor: RealNode, workdir: Path) -> None:
    """The donor's lease API certificate for its node's address (a Secret), and the CA
    that signed it (a ConfigMap), in the release namespace, before the install."""
    ca = CertificateAuthority(workdir / "pki")
    tls = ca.issue("donor", donor.name, ips=(address(donor),), server=True)
    with contextlib.suppress(Conflict):
        kube.create(path("v1", "namespaces"), {"metadata": {"name": cc.NAMESPACE}})
    secrets = path("v1", "secrets", namespace=cc.NAMESPACE)
    string_data = {"tls.crt": tls.cert.read_text(), "tls.key": tls.key.read_text()}
    tls_secret = {"metadata": {"name": "donor-tls"}, "type": "kubernetes.io/tls"}
    kube.create(secrets, {**tls_secret, "stringData": string_data})
    config_maps = path("v1", "configmaps", namespace=cc.NAMESPACE)
    ca_data = {"ca.crt": ca.cert_path.read_text()}
    kube.create(config_maps, {"metadata": {"name": "donor-ca"}, "data": ca_data})


def donor_api_flags(donor: RealNode) -> list[str]:
    """helm's flags naming the donor's lease API by its node's address."""
    api = json.dumps({donor.name: f"https://{address(donor)}:{API_PORT}"})
    return ["--set-json", f"remoteGPU.donorApis={api}"]


def remote_devices(kube: Kube) -> list[str]:
    """The names of the remote-lease devices published (the lenders' plugins')."""
    slices = kube.get(path(RESOURCE, "resourceslices"))["items"]
    devices = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
    return [d for d in devices if d.endswith("-remote")]


def wait_remote_device(kube: Kube, nodes: Sequence[RealNode], timeout: float = 180) -> None:
    """Until a lender's plugin publishes its GPU as a remote device."""
    wait_for(
        lambda: remote_devices(kube),
        timeout,
        "a remote device published",
        0.5,
        lambda: cc.describe(kube, nodes),
    )


@dataclass
class RemoteRun:
    """What a matmul pod with a remote GPU ended with."""

    phase: str
    out: JSON  # the workload's last line
    ready: JSON = field(default_factory=dict)  # the claim's device status at RemoteGPUReady

    @property
    def data(self) -> JSON:
        data: JSON = self.ready.get("data") or {}
        return data


def remote_ready(claim: JSON | None) -> JSON | None:
    """The claim's device status once it shows RemoteGPUReady."""
    for dev in ((claim or {}).get("status") or {}).get("devices") or []:
        if any(
            c.get("type") == REMOTE_READY and c.get("status") == "True"
            for c in dev.get("conditions") or []
        ):
            found: JSON = dev
            return found
    return None


def run_matmul(
    kube: Kube,
    namespace: str,
    consumer: RealNode,
    image: str,
    args: Sequence[str],
    nodes: Sequence[RealNode] = (),
) -> RemoteRun:
    """A pod ``matmul`` on ``consumer`` running the matmul workload with ``args`` in
    ``image`` with a claim for a remote GPU, until it ends (``nodes`` described if it does
    not); its claim's device status is kept from while it held the lease (it goes with the
    allocation once the pod is done)."""
    command = ["python3", "-m", "remote_gpu.workloads.matmul", *args]
    claim, pod = matmul_claim_and_pod("matmul", consumer.name, [], CLASS)
    pod["spec"]["containers"][0]["command"] = command
    pod = for_real_node(pod, consumer.name, image)
    # Not root: the product image's own user (10001) reads the lease's token.
    pod["spec"]["securityContext"] = {"runAsUser": 10001, "runAsNonRoot": True}
    kube.create(path(RESOURCE, "resourceclaims", namespace=namespace), claim)
    kube.create(path("v1", "pods", namespace=namespace), pod)
    pod_path = path("v1", "pods", "matmul", namespace=namespace)
    claim_path = path(RESOURCE, "resourceclaims", "matmul", namespace=namespace)
    ready: JSON = {}

    def ended() -> bool:
        ready.update(remote_ready(kube.get_or_none(claim_path)) or {})
        return kube.get(pod_path)["status"].get("phase") in ("Succeeded", "Failed")

    def describe() -> str:
        slices = kube.get(path(RESOURCE, "resourceslices"))["items"]
        node = kube.get(path("v1", "nodes", consumer.name))["metadata"]["labels"]
        return (
            f"claim: {kube.get_or_none(claim_path)}\n{consumer.name}: {node}\n"
            f"slices: {[s['spec'] for s in slices]}\n{cc.describe(kube, nodes)}"
        )

    wait_for(ended, 120, "the matmul pod to finish", 0.2, describe)
    log = cc.pod_log(kube, namespace, "matmul", "main").strip().splitlines()
    out: JSON = json.loads(log[-1]) if log else {}
    return RemoteRun(kube.get(pod_path)["status"]["phase"], out, ready)
