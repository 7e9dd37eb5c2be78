"""The scenario helpers: claims, pods and examples a test puts on one suite's nodes."""

from __future__ import annotations

from composable_dra.k8s.kube import JSON, path
from composable_dra.model import names
from testbed import examples
from testbed.cluster_view import ClusterView
from testbed.kubelet_emulator import RUN_SECONDS_ANNOTATION
from testbed.objects import HOSTNAME, RESOURCE, pod_body
from testbed.realnode_pods import for_real_node

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
_CLAIM_PLURALS = {
    "ResourceClaim": "resourceclaims",
    "ResourceClaimTemplate": "resourceclaimtemplates",
}


def claim_body(name: str, local_first: bool = True) -> JSON:
    """A claim for one GPU: a node's own first, else a pool's (``local_first``), or any.
    The ``local`` alternative names the local class, whose selector rejects a pool device
    in one CEL evaluation (composable_dra/model/device_classes.py)."""
    if local_first:
        request: JSON = {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "local",
                    "deviceClassName": names.LOCAL_DEVICE_CLASS,
                },
                {"name": "pool", "deviceClassName": names.DEVICE_CLASS},
            ],
        }
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


class Workload(ClusterView):
    """The cluster view, and what a scenario creates in it."""

    def create_claim(self, namespace: str, name: str, local_first: bool = True) -> JSON:
        """A claim for one GPU: a local one if the node has one free, else from the pool."""
        return self.kube.create(
            path(RESOURCE, "resourceclaims", namespace=namespace), claim_body(name, local_first)
        )

    def create_pod(
        self,
        namespace: str,
        name: str,
        *,
        claim: str | None = None,
        node: str | None = None,
        run_seconds: float | None = None,
        local_first: bool = True,
        own_nodes: bool = True,
    ) -> JSON:
        """A pod with its own claim (named like the pod unless given), on this suite's nodes
        unless ``own_nodes`` is False (nodes a bench made itself)."""
        claim_name = claim or name
        if claim is None:
            self.create_claim(namespace, claim_name, local_first)
        pod = pod_body(name, claim_name, node=node or None, image=PAUSE_IMAGE)
        if own_nodes:
            pod = self.on_own_nodes(pod)
        pod["spec"]["terminationGracePeriodSeconds"] = 0
        if run_seconds is not None:
            pod["metadata"]["annotations"] = {RUN_SECONDS_ANNOTATION: str(run_seconds)}
        real = self.hosts.real_named(node)
        if real is not None:
            # A real container: it prints its environment (the CDI edits) and waits.
            pod = for_real_node(pod, real.name, real.image)
            pod["spec"]["containers"][0]["command"] = ["sh", "-c", "env; exec sleep 3600"]
        return self.kube.create(path("v1", "pods", namespace=namespace), pod)

    def apply_example(self, name: str, namespace: str, host: str) -> list[str]:
        """Create an example of deploy/examples with its pods on ``host``'s node (made to
        run there when it is a real node); the pods' names."""
        node = self.node_of(host)
        real = self.real_nodes.get(host)
        pods = []
        for obj in examples.load(name):
            if obj["kind"] == "DeviceClass":
                continue  # the suite's own, of the same name
            if obj["kind"] == "Pod":
                pod = (
                    for_real_node(obj, node, real.image)
                    if real is not None
                    else {**obj, "spec": {**obj["spec"], "nodeSelector": {HOSTNAME: node}}}
                )
                self.kube.create(path("v1", "pods", namespace=namespace), pod)
                pods.append(obj["metadata"]["name"])
                continue
            plural = _CLAIM_PLURALS.get(obj["kind"])
            if plural is None:  # plugin-static: a DaemonSet of its own, not for the suite
                raise ValueError(f"example {name}: a {obj['kind']} has no place in the suite")
            self.kube.create(path(RESOURCE, plural, namespace=namespace), obj)
        return pods
