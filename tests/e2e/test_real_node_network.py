"""Two real nodes, each with what a cluster's node has: its own network namespace with a
pod network (bridge CNI), its own host directories behind hostPath volumes, and the
product's image (hack/image/build.sh) imported into its containerd.

On each node a pod of the product's image, in the pod network, reaches the API server as
an in-cluster client does (``KUBERNETES_SERVICE_HOST``/``PORT``, TLS verified against the
cluster's CA) and writes a file through a hostPath volume of ``/var/run/cdi``: the file
lands in that node's CDI directory (where its containerd reads specs), not in the other's.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from testbed.controlplane import ControlPlane
from testbed.product_image import ProductImage, find_product_image
from testbed.realnode import RealNode
from testbed.realnodes import started_nodes, wait_output, wait_running

pytestmark = pytest.mark.e2e

# In the pod: the API server's /version through the Service address the kubelet gives
# every pod, with the cluster's CA; then a file through the hostPath volume.
PROBE = """
import json, os, ssl, time, urllib.request
url = "https://%s:%s/version" % (
    os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
ctx = ssl.create_default_context(cafile="/ca/ca.crt")
with urllib.request.urlopen(url, context=ctx, timeout=20) as resp:
    version = json.load(resp)["gitVersion"]
with open("/host-cdi/probe-" + os.environ["NODE_NAME"], "w") as f:
    f.write(version)
print("API", version, flush=True)
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def product_image() -> ProductImage:
    return find_product_image()


@pytest.fixture
def two_nodes(
    control_plane: ControlPlane,
    node_bin_dir: Path,
    short_tmp: Path,
    unique: str,
    product_image: ProductImage,
) -> Iterator[list[RealNode]]:
    names_ = [f"net{i}-{unique}" for i in (1, 2)]
    archive = [product_image.archive]
    with started_nodes(control_plane, node_bin_dir, short_tmp, names_, archive) as nodes:
        yield nodes


def probe_pod(node: str, image: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"probe-{node}"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "dnsPolicy": "Default",  # no cluster DNS on the test nodes
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", PROBE],
                    "env": [
                        {
                            "name": "NODE_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                        }
                    ],
                    # Root for the hostPath directory, as the chart's plugin runs.
                    "securityContext": {"runAsUser": 0},
                    "volumeMounts": [
                        {"name": "ca", "mountPath": "/ca", "readOnly": True},
                        {"name": "cdi", "mountPath": "/host-cdi"},
                    ],
                }
            ],
            "volumes": [
                {"name": "ca", "configMap": {"name": "cluster-ca"}},
                {"name": "cdi", "hostPath": {"path": "/var/run/cdi", "type": "Directory"}},
            ],
        },
    }


def test_pods_get_their_node_network_reach_the_api_and_their_node_host_paths(
    two_nodes: list[RealNode],
    kube_json: Kube,
    namespace: str,
    control_plane: ControlPlane,
    product_image: ProductImage,
) -> None:
    assert control_plane.ca is not None
    ca = control_plane.ca.cert_path.read_text()
    body = {"metadata": {"name": "cluster-ca"}, "data": {"ca.crt": ca}}
    kube_json.create(path("v1", "configmaps", namespace=namespace), body)
    for node in two_nodes:
        kube_json.create(
            path("v1", "pods", namespace=namespace), probe_pod(node.name, product_image.ref)
        )

    pod_ips = set()
    for node in two_nodes:
        assert node.network is not None
        got = kube_json.get(path("v1", "nodes", node.name))
        internal = [a["address"] for a in got["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal == [node.network.node_ip]
        pod = wait_running(kube_json, node, namespace, f"probe-{node.name}")
        assert not pod["spec"].get("hostNetwork")
        ip = ipaddress.ip_address(pod["status"]["podIP"])
        assert ip in ipaddress.ip_network(node.network.pod_cidr), (ip, node.network.pod_cidr)
        pod_ips.add(ip)
        out = wait_output(node, namespace, f"probe-{node.name}", "API ")
        assert "API v1.37" in out
    assert len(pod_ips) == 2

    # Each pod's hostPath /var/run/cdi is its own node's CDI directory.
    first, second = two_nodes
    for node, other in ((first, second), (second, first)):
        mark = node.cdi_dir / f"probe-{node.name}"
        assert mark.read_text().startswith("v1.37")
        assert not (other.cdi_dir / f"probe-{node.name}").exists()
