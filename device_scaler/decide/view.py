"""The snapshot indexed once for every phase, and the live counts the phases pass on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from api.v1alpha1 import ComposableResourceSpec
from composable_dra.k8s.kube import JSON
from composable_dra.model.sizing import spec_of
from device_scaler.decide.inputs import ScalerSettings, ScalerSnapshot
from device_scaler.decide.reading import is_live, meta_of


@dataclass(frozen=True)
class Counts:
    """Live resources by (fabric, node, model): what a request's min and max are checked
    against. A value: ``add`` returns a new one, so each phase says what it changed."""

    by_key: Mapping[tuple[str, str, str], int] = field(default_factory=dict)

    def count(self, fabric: str, node: str | None, model: str) -> int:
        """On one node, or cluster-wide when node is None."""
        return sum(
            n
            for (f, nd, m), n in self.by_key.items()
            if f == fabric and m == model and node in (None, nd)
        )

    def add(self, key: tuple[str, str, str], delta: int = 1) -> Counts:
        return Counts({**self.by_key, key: self.by_key.get(key, 0) + delta})


def count_key(spec: ComposableResourceSpec) -> tuple[str, str, str]:
    return (spec.fabric, spec.target_node, spec.model or "")


def live_counts(resources: Iterable[JSON], specs: Mapping[str, ComposableResourceSpec]) -> Counts:
    counts: dict[tuple[str, str, str], int] = {}
    for cr in resources:
        spec = specs.get(meta_of(cr)["name"])
        if spec is not None and is_live(cr):
            counts[count_key(spec)] = counts.get(count_key(spec), 0) + 1
    return Counts(counts)


def block_holders(
    resources: Iterable[JSON], specs: Mapping[str, ComposableResourceSpec]
) -> dict[tuple[str, str], str]:
    """(fabric, block) -> the resource that holds it (any not Detached)."""
    holders = {}
    for cr in resources:
        spec = specs.get(meta_of(cr)["name"])
        if spec is not None and (cr.get("status") or {}).get("phase") != "Detached":
            holders[(spec.fabric, spec.device_id)] = meta_of(cr)["name"]
    return holders


@dataclass(frozen=True)
class DecisionView:
    """What every phase reads: the snapshot, indexed once."""

    s: ScalerSnapshot
    cfg: ScalerSettings
    resources: Mapping[str, JSON]
    specs: Mapping[str, ComposableResourceSpec]
    holders: Mapping[tuple[str, str], str]


def index(s: ScalerSnapshot, cfg: ScalerSettings) -> DecisionView:
    resources = {meta_of(cr)["name"]: cr for cr in s.resources}
    specs = {n: spec for n, cr in resources.items() if (spec := spec_of(cr)) is not None}
    return DecisionView(s, cfg, resources, specs, block_holders(s.resources, specs))
