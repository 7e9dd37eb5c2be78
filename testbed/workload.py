"""The scenario helpers: claims, pods and examples a test puts on one suite's nodes."""

from __future__ import annotations

from composable_dra.k8s.kube import JSON, path
from composable_dra.model import names
from testbed import examples
from testbed.cluster_view import ClusterView
from testbed.kubelet_emulator import RUN_SECONDS_ANNOTATION
from testbed.objects import HOSTNAME, RESOURCE, pod_body
from testbed.realnode_pods import ENV_AND_WAIT, for_real_node

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


def scenario_pod(
    name: str, claim: str, *, node: str | None, run_seconds: float | None, real_image: str | None
) -> JSON:
    """A scenario's pod using ``claim``, on ``node`` when given (else where the scheduler
    puts it); each caller says all three, which differ between them. For emulated nodes the
    pause image; with ``real_image``, made to run on a real node: a container of that image
    that prints its environment (the CDI edits) and waits. ``run_seconds``: it exits then,
    never restarted (the kubelet emulator reads the annotation; a real container sleeps
    that long)."""
    if real_image is None:
        pod = pod_body(name, claim, node=node, image=PAUSE_IMAGE)
        pod["spec"]["terminationGracePeriodSeconds"] = 0
    else:
        wait = ENV_AND_WAIT if run_seconds is None else f"env; exec sleep {run_seconds}"
        pod = for_real_node(pod_body(name, claim, command=["sh", "-c", wait]), node, real_image)
    if run_seconds is not None:
        pod["metadata"]["annotations"] = {RUN_SECONDS_ANNOTATION: str(run_seconds)}
        pod["spec"]["restartPolicy"] = "Never"
    return pod


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
        unless ``own_nodes`` is False (nodes a bench made itself); made to run there when
        ``node`` is a real one (``scenario_pod``)."""
        claim_name = claim or name
        if claim is None:
            self.create_claim(namespace, claim_name, local_first)
        real = self.hosts.real_named(node)
        pod = scenario_pod(
            name,
            claim_name,
            node=node or None,
            run_seconds=run_seconds,
            real_image=real.image if real is not None else None,
        )
        if own_nodes:
            pod = self.on_own_nodes(pod)
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
