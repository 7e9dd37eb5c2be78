"""The kubelet's part in a plugin's lease token, for a plugin that runs as a process.

In a cluster the kubelet projects the plugin pod's service-account token into the pod: a
TokenRequest, as the node, bound to the pod (so the API server writes the pod's node into
it), renewed at 80% of its life. A test's plugin is a process, not a pod, so the harness
does the same: a Pod on the node that runs as the plugins' service account, and its token,
requested with the node's own credentials (``system:node:<node>``, which the Node
authorizer and NodeRestriction allow only for pods on that node, and only for an audience
the pod's own projected volume names), written to the file the plugin's
``--lease-token-file`` names.
"""

from __future__ import annotations

import threading
from pathlib import Path

from kubernetes import client

from composable_dra.k8s import retry
from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.lending.remote_leases import DONORS_AUDIENCE
from dra_driver.fsutil import atomic_write
from testbed.controlplane import ControlPlane
from testbed.realnode import node_kubeconfig
from testbed.wait import wait_for

TOKEN_SECONDS = 600  # what the chart's projected volume asks for, the least allowed


def request_token(
    kube: Kube,
    namespace: str,
    sa: str,
    bound: JSON,
    audience: str | None,
    seconds: int = TOKEN_SECONDS,
) -> str:
    """A token of ``namespace/sa`` bound to ``bound`` (a Pod or a Node, as the API server
    returned it) for ``audience`` (None: the API server's own), as ``kube``'s user asks
    for it; KubeError when it may not."""
    meta = bound["metadata"]
    out = kube.create(
        path("v1", "serviceaccounts", sa, namespace=namespace, subresource="token"),
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [audience] if audience is not None else [],
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "kind": bound["kind"],
                    "apiVersion": "v1",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        },
    )
    return str(out["status"]["token"])


def bearer_kube(cp: ControlPlane, token: str) -> Kube:
    """A client of ``cp`` that authenticates with ``token`` (a service account's)."""
    assert cp.ca is not None
    cfg = client.Configuration(host=cp.server)
    cfg.ssl_ca_cert = str(cp.ca.cert_path)
    cfg.api_key = {"BearerToken": f"Bearer {token}"}
    return Kube(client.ApiClient(cfg))


class PodToken:
    """A pod on ``node`` running as ``namespace/sa``, and its projected token for
    ``audience`` at ``file``, renewed as the kubelet renews it. ``start`` returns once the
    first token is written."""

    def __init__(
        self,
        cp: ControlPlane,
        admin: Kube,
        node: str,
        namespace: str,
        sa: str,
        file: Path,
        audience: str = DONORS_AUDIENCE,
    ) -> None:
        self.cp, self.admin, self.node = cp, admin, node
        self.namespace, self.sa, self.file, self.audience = namespace, sa, file, audience
        self.pod_name = f"lease-token-{node}"[:63]
        self.pod: JSON = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def node_kube(self) -> Kube:
        """A client with the node's own credentials: what its kubelet is."""
        kubeconfig = self.file.parent / f"{self.node}.kubeconfig"
        return Kube.from_config(str(node_kubeconfig(self.cp, self.node, kubeconfig, "pod-token")))

    def start(self) -> PodToken:
        self.file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.pod = self.admin.create(
            path("v1", "pods", namespace=self.namespace),
            {
                "metadata": {"name": self.pod_name},
                "spec": {
                    "nodeName": self.node,
                    "serviceAccountName": self.sa,
                    "containers": [{"name": "plugin", "image": "example.invalid/plugin"}],
                    # As the chart's plugin pod: v1.37.1 lets a kubelet request a pod's
                    # token only for an audience the pod's own volumes name: the lease
                    # token's, and the API server's (the pod's API access).
                    "volumes": [
                        {
                            "name": "tokens",
                            "projected": {
                                "sources": [
                                    {"serviceAccountToken": {"path": "api"}},
                                    {
                                        "serviceAccountToken": {
                                            "path": "lease",
                                            "audience": self.audience,
                                            "expirationSeconds": TOKEN_SECONDS,
                                        }
                                    },
                                ]
                            },
                        }
                    ],
                },
            },
        )
        kube = self.node_kube()
        # The Node authorizer learns of the pod from its own watch: until then, 403.
        wait_for(lambda: self._renew(kube), 30, f"a token bound to {self.pod_name} for {self.node}")
        self._thread = threading.Thread(
            target=self._renewing, args=(kube,), name=f"pod-token-{self.node}", daemon=True
        )
        self._thread.start()
        return self

    def _renew(self, kube: Kube) -> bool:
        token = request_token(kube, self.namespace, self.sa, self.pod, self.audience)
        atomic_write(self.file, token.encode(), mode=0o600, durable=False)
        return True

    def _renewing(self, kube: Kube) -> None:
        # The kubelet renews a projected token at 80% of its life; a failed renewal is
        # retried well within the fifth that is left.
        wait, failures = TOKEN_SECONDS * 0.8, 0
        while not self._stop.wait(wait):
            try:
                self._renew(kube)
                wait, failures = TOKEN_SECONDS * 0.8, 0
            except KubeError:
                failures += 1
                wait = retry.delay(failures, cap=10)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.admin.delete(
            path("v1", "pods", self.pod_name, namespace=self.namespace), gracePeriodSeconds=0
        )
