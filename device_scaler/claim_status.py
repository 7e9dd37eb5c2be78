"""A ResourceClaim's ``status.devices`` as the scaler's two controllers write it: by
server-side apply, each under its own field manager (the scaler's FabricDevice*
conditions, the lease controller's RemoteGPU* ones), so neither drops the other's."""

from __future__ import annotations

from collections.abc import Sequence

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.k8s.resource_slices import RESOURCE_API


def status_body(devices: Sequence[JSON], *, namespace: str, name: str, uid: str) -> JSON:
    """The apply body: ``devices`` are all the entries its manager owns (apply drops the
    ones a manager stops sending)."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "status": {"devices": list(devices)},
    }


def apply_devices(
    kube: Kube, devices: Sequence[JSON], manager: str, *, namespace: str, name: str, uid: str
) -> None:
    """Apply ``devices`` to the claim's status as ``manager``; NotFound when it is gone."""
    url = path(RESOURCE_API, "resourceclaims", name, namespace=namespace, subresource="status")
    kube.apply(url, status_body(devices, namespace=namespace, name=name, uid=uid), manager)
