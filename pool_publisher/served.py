"""Pool slices as this API server keeps them: what the publisher writes where a DRA
feature is missing (the start's probe, composable_dra/k8s/feature_probe.py).

The API server drops a field whose feature gate is off without a word, so a slice written
with it never reads back the same: the publisher would rewrite its pools on every pass.
So the fields the server lacks are not written at all. And a pool device without binding
conditions would let the scheduler bind a pod to a node at once, before any GPU is
attached there (it would wait in ContainerCreating for a GPU nobody attaches): without
them the pool is held back from the scheduler by a node selector no node matches, and
stays published for the warm standby, which attaches its blocks ahead of claims as local
GPUs (docs/operations.md, Kubernetes versions).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from composable_dra.k8s.features import ABOUT, ApiFeatures, Feature
from composable_dra.k8s.kube import JSON
from composable_dra.model import names

# The label of the held-back pool's selector: required both to exist and not to exist.
HELD_BACK_LABEL = f"{names.PREFIX}/pool-needs-binding-conditions"
_BINDING_FIELDS = ("bindsToNode", "bindingConditions", "bindingFailureConditions")
# The Warning Event on a waiting claim of a held-back pool, and its message.
POOL_HELD_BACK = "PoolNeedsBindingConditions"
HELD_BACK_WHY = (
    f"pool GPUs are not offered to the scheduler: this API server lacks "
    f"{ABOUT[Feature.BINDING_CONDITIONS].what} ({ABOUT[Feature.BINDING_CONDITIONS].needs}), "
    "without which a pod would be bound before its GPU is attached. A local GPU serves "
    "the claim: one a Fabric's warm standby (spec.standby) attaches ahead, or the node's own"
)


@dataclass(frozen=True)
class Served:
    """What the publisher may write: the features of its slices the server keeps."""

    binding_conditions: bool = True
    device_taints: bool = True

    @classmethod
    def of(cls, found: ApiFeatures) -> Served:
        return cls(
            binding_conditions=Feature.BINDING_CONDITIONS in found.present,
            device_taints=Feature.DEVICE_TAINTS in found.present,
        )


def held_back() -> list[JSON]:
    """Two requirements no node meets at once."""
    return [
        {"key": HELD_BACK_LABEL, "operator": "Exists"},
        {"key": HELD_BACK_LABEL, "operator": "DoesNotExist"},
    ]


def as_served(body: JSON, served: Served) -> JSON:
    """A pool slice without the fields the server lacks (a copy; ``body`` when it lacks
    none), held back from the scheduler without binding conditions."""
    if served.binding_conditions and served.device_taints:
        return body
    out = copy.deepcopy(body)
    spec = out["spec"]
    drop = (() if served.binding_conditions else _BINDING_FIELDS) + (
        () if served.device_taints else ("taints",)
    )
    for device in spec.get("devices") or []:
        for key in drop:
            device.pop(key, None)
    if not served.binding_conditions:
        terms = (spec.get("nodeSelector") or {}).get("nodeSelectorTerms") or [{}]
        for term in terms:
            term["matchExpressions"] = [*(term.get("matchExpressions") or []), *held_back()]
        spec["nodeSelector"] = {"nodeSelectorTerms": terms}
    return out


EVERYTHING = Served()  # a server with every feature the pools use
