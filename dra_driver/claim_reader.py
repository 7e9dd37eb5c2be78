"""The plugin's thin adapter to the API server for claims: plain dicts, never typed models."""

from __future__ import annotations

from typing import Any

from composable_dra.k8s.kube import Kube, NotFound, path
from dra_driver.prepare import ClaimNotFound


class ClaimReader:
    """GET a ResourceClaim as a plain dict (fields the client does not know survive)."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube

    def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self._kube.get(
                path("resource.k8s.io/v1", "resourceclaims", name, namespace=namespace)
            )
        except NotFound:
            raise ClaimNotFound(f"claim {namespace}/{name} not found") from None
