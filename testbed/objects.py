"""Objects the end-to-end tests, the suite and the benchmarks create again and again: the
DeviceClass, a claim for one device, a pod that uses a claim, a ComposableResource.

Builders return plain dicts (``*_body``); ``create_*`` helpers also send them.
"""

from __future__ import annotations

import contextlib
import copy

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import JSON, Conflict, Kube, path
from composable_dra.model import names
from composable_dra.model.device_classes import device_classes

RESOURCE = "resource.k8s.io/v1"
HOSTNAME = "kubernetes.io/hostname"
# An image no node pulls: the kubelet emulator never starts a container.
NO_IMAGE = "example.invalid/app"


def ensure_device_class(kube: Kube, driver: str = names.DRIVER) -> str:
    """The chart's DeviceClasses for ``driver`` (they may exist from another test); the name
    of the one selecting every device."""
    for body in device_classes(driver):
        with contextlib.suppress(Conflict):
            kube.create(path(RESOURCE, "deviceclasses"), body)
    return names.DEVICE_CLASS


def create_claim(kube: Kube, namespace: str, name: str, exactly: JSON | None = None) -> JSON:
    """A claim with one request ``gpu`` for exactly one device (of the examples' class
    unless ``exactly`` says otherwise)."""
    request = exactly or {"deviceClassName": names.DEVICE_CLASS}
    return kube.create(
        path(RESOURCE, "resourceclaims", namespace=namespace),
        {
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
        },
    )


def pod_body(
    name: str,
    claim: str | None = None,
    *,
    template: str | None = None,
    node: str | None = None,
    image: str = NO_IMAGE,
    command: list[str] | None = None,
    ref: str = "gpu",
) -> JSON:
    """A pod with one container ``main`` that uses ``claim`` (or a claim made from
    ``template``) by its pod-level name ``ref``, pinned to ``node`` when given."""
    source = (
        {"resourceClaimName": claim}
        if template is None
        else {"resourceClaimTemplateName": template}
    )
    container: JSON = {"name": "main", "image": image, "resources": {"claims": [{"name": ref}]}}
    if command is not None:
        container["command"] = command
    spec: JSON = {"containers": [container], "resourceClaims": [{"name": ref, **source}]}
    if node is not None:
        spec["nodeSelector"] = {HOSTNAME: node}
    return {"metadata": {"name": name}, "spec": spec}


def create_claim_pod(
    kube: Kube, namespace: str, name: str, node: str | None = None, exactly: JSON | None = None
) -> JSON:
    """A claim (see ``create_claim``) and a pod of the same name using it; the pod."""
    create_claim(kube, namespace, name, exactly)
    return kube.create(path("v1", "pods", namespace=namespace), pod_body(name, name, node=node))


def create_resource(
    kube: Kube, name: str, fabric: str, block: str, node: str, **spec: object
) -> JSON:
    """A ComposableResource: ``block`` of ``fabric`` for ``node``."""
    return kube.create(
        path(API_VERSION, "composableresources"),
        {
            "apiVersion": API_VERSION,
            "kind": "ComposableResource",
            "metadata": {"name": name},
            "spec": {"fabric": fabric, "deviceID": block, "targetNode": node, **spec},
        },
    )


# The annotation kube-scheduler puts on the claim it makes for a pod's extended resources.
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"


def as_scheduler_claim(claim: JSON, pod: str = "trainer", pod_uid: str = "pod-uid-1") -> JSON:
    """``claim`` as kube-scheduler writes one for a pod's extended resources
    (extendeddynamicresources.go): a generated name, its annotation, the pod as its
    controller, and requests named after the asking container (``container-0-request-0``)
    in its spec and its allocation. No name a user chose."""
    out = copy.deepcopy(claim)
    renamed = "container-0-request-0"
    meta = out["metadata"]
    meta["name"] = f"{pod}-extended-resources-x7k2p"
    meta["annotations"] = {**(meta.get("annotations") or {}), EXTENDED_RESOURCE_CLAIM: "true"}
    meta["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid, "controller": True}
    ]
    for request in ((out.get("spec") or {}).get("devices") or {}).get("requests") or []:
        request["name"] = renamed
    allocation = (out.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        result["request"] = renamed
    return out
