"""Apply the manifests of deploy/examples into a namespace (the demo and the e2e tests)."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

import yaml

from composable_dra.k8s.kube import JSON, Kube, path

EXAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "examples"
_PLURALS = {
    "ResourceClaimTemplate": "resourceclaimtemplates",
    "ResourceClaim": "resourceclaims",
    "Pod": "pods",
    "DeviceClass": "deviceclasses",
    "Deployment": "deployments",
    "Service": "services",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
}
_CLUSTER_SCOPED = {"DeviceClass"}


def load(name: str) -> list[JSON]:
    text = (EXAMPLES / f"{name}.yaml").read_text()
    return [doc for doc in yaml.safe_load_all(text) if doc]


def plural_path(obj: JSON, namespace: str, name: str | None = None) -> str:
    """The API path of ``obj``'s kind in ``namespace`` (of the object ``name``)."""
    kind = obj["kind"]
    ns = None if kind in _CLUSTER_SCOPED else namespace
    return path(obj["apiVersion"], _PLURALS[kind], name, namespace=ns)


def apply(
    kube: Kube,
    name: str,
    namespace: str,
    pod: Callable[[JSON], JSON] | None = None,
    edit: Callable[[JSON], JSON] | None = None,
    skip: Collection[str] = (),
) -> list[JSON]:
    """Create the example's objects in ``namespace`` (each Pod through ``pod``, every
    object through ``edit``, when given; none of the kinds in ``skip``); returns them as
    created."""
    created = []
    for obj in load(name):
        kind = obj["kind"]
        if kind in skip:
            continue
        if kind == "Pod" and pod is not None:
            obj = pod(obj)
        if edit is not None:
            obj = edit(obj)
        created.append(kube.create(plural_path(obj, namespace), obj))
    return created


def pods(name: str) -> list[str]:
    return [o["metadata"]["name"] for o in load(name) if o["kind"] == "Pod"]
