"""Apply the manifests of deploy/examples into a namespace (the demo and the e2e tests)."""

from __future__ import annotations

from pathlib import Path

import yaml

from composable_dra.kube import JSON, Kube, path

EXAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "examples"
_PLURALS = {
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "ResourceClaim": "resourceclaims",
    "Pod": "pods",
    "DeviceClass": "deviceclasses",
}
_CLUSTER_SCOPED = {"DeviceClass"}


def load(name: str) -> list[JSON]:
    text = (EXAMPLES / f"{name}.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def apply(kube: Kube, name: str, namespace: str) -> list[JSON]:
    """Create the example's objects in ``namespace``; returns them as created."""
    created = []
    for obj in load(name):
        kind = obj["kind"]
        ns = None if kind in _CLUSTER_SCOPED else namespace
        created.append(kube.create(path(obj["apiVersion"], _PLURALS[kind], namespace=ns), obj))
    return created


def pods(name: str) -> list[str]:
    return [o["metadata"]["name"] for o in load(name) if o["kind"] == "Pod"]
