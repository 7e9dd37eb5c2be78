"""How many GPUs a node keeps, and which go first: the one sizing rule of the suite.

Pure functions over ComposableResources and ComposabilityRequests as the API server sends
them. The scaler's idle rule and the operator's ComposabilityRequest sizing both use these,
so "least recently used first" and a request's min/max mean one thing everywhere
(docs/architecture.md, Invariants: one idle rule).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import ValidationError

from api.v1alpha1 import ComposabilityRequestSpec, ComposableResourceSpec
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import parse_time
from composable_dra.model import names

# Stamped by the scaler when a GPU's last allocation ends.
ANN_LAST_USED = f"{names.PREFIX}/last-used"


def last_used(resource: JSON, default: float) -> float:
    """When the resource's GPU last served anyone: the scaler's last-used stamp, else
    status.lastUsedAt, else when it was attached, else when the resource was made."""
    meta = resource.get("metadata") or {}
    status = resource.get("status") or {}
    return (
        parse_time((meta.get("annotations") or {}).get(ANN_LAST_USED))
        or parse_time(status.get("lastUsedAt"))
        or parse_time(status.get("attachedAt"))
        or parse_time(meta.get("creationTimestamp"))
        or default
    )


def least_recently_used(resources: Iterable[JSON], default: float) -> list[JSON]:
    """The resources, least recently used first (the name breaks a tie)."""
    return sorted(
        resources,
        key=lambda r: (last_used(r, default), str((r.get("metadata") or {}).get("name", ""))),
    )


def spec_of(resource: JSON) -> ComposableResourceSpec | None:
    """A ComposableResource's spec, typed; None for one the schema should have refused."""
    try:
        return ComposableResourceSpec.model_validate(resource.get("spec") or {})
    except ValidationError:
        return None


def desired_size(spec: ComposabilityRequestSpec) -> int:
    """A request's size, clamped to its min and max."""
    size = spec.size
    if spec.min_size is not None:
        size = max(size, spec.min_size)
    if spec.max_size is not None:
        size = min(size, spec.max_size)
    return size


@dataclass(frozen=True)
class Limits:
    min_size: int = 0
    max_size: int | None = None


def limits(requests: Iterable[JSON], fabric: str, model: str, node: str | None) -> Limits:
    """min/max of the ComposabilityRequests for a model on a node (node None: cluster-wide).

    Reads the spec's fields one by one (not the whole model): only these bounds matter here.
    """
    lo, hi = 0, None
    for req in requests:
        spec = req.get("spec") or {}
        if spec.get("fabric") != fabric or spec.get("model") != model:
            continue
        if spec.get("targetNode") != node:
            continue
        if spec.get("minSize") is not None:
            lo = max(lo, int(spec["minSize"]))
        if spec.get("maxSize") is not None:
            hi = int(spec["maxSize"]) if hi is None else min(hi, int(spec["maxSize"]))
    return Limits(lo, hi)
