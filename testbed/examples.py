"""Apply the manifests of deploy/examples into a namespace (the demo and the e2e tests)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from composable_dra.k8s.kube import JSON, Kube, path

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


def apply(
    kube: Kube, name: str, namespace: str, pod: Callable[[JSON], JSON] | None = None
) -> list[JSON]:
    """Create the example's objects in ``namespace`` (each Pod through ``pod`` when given);
    returns them as created."""
    created = []
    for obj in load(name):
        kind = obj["kind"]
        if kind == "Pod" and pod is not None:
            obj = pod(obj)
        ns = None if kind in _CLUSTER_SCOPED else namespace
        created.append(kube.create(path(obj["apiVersion"], _PLURALS[kind], namespace=ns), obj))
    return created


def pods(name: str) -> list[str]:
    return [o["metadata"]["name"] for o in load(name) if o["kind"] == "Pod"]
