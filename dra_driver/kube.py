"""The plugin's thin adapter to the API server for claims: raw JSON, never typed models."""

from __future__ import annotations

import json
from typing import Any

from dra_driver.prepare import ClaimNotFound


class ClaimReader:
    """GET a ResourceClaim as a plain dict (fields the client does not know survive)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self._resource = client.ResourceV1Api(api)

    def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        from kubernetes.client import ApiException

        try:
            resp = self._resource.read_namespaced_resource_claim(
                name, namespace, _preload_content=False
            )
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimNotFound(f"claim {namespace}/{name} not found") from None
            raise
        claim: dict[str, Any] = json.loads(resp.data)
        return claim
