"""The snapshot indexed once for every phase, and the live counts the phases pass on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from api.v1alpha1 import ComposableResourceSpec
from composable_dra.k8s.derived import Derived
from composable_dra.k8s.kube import JSON
from composable_dra.model.sizing import spec_of
from device_scaler.decide.claims import ClaimFacts, claim_facts
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
    claims: Sequence[ClaimFacts]  # the claims allocated devices of our driver

    @cached_property
    def users(self) -> Mapping[tuple[str, str], str]:
        """(pool, device) -> the claim that holds it; built on first use: a pass with no
        idle GPU and no standby zone needs none."""
        return local_users(self.claims)


def local_users(claims: Iterable[ClaimFacts]) -> dict[tuple[str, str], str]:
    """(pool, device) -> the uid of the first claim whose allocation names it."""
    users: dict[tuple[str, str], str] = {}
    for facts in claims:
        for r in facts.results:
            users.setdefault((str(r.get("pool")), str(r.get("device"))), facts.uid)
    return users


class Memo:
    """What a pass reads of each object, kept for the next pass while the informer keeps
    the same object (composable_dra/k8s/derived.py): a claim's facts, a resource's typed
    spec. At 1,000 nodes a pass reads 9,000 claims, and passes follow events closely."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self._claims = Derived(lambda claim: claim_facts(claim, driver))
        self._specs = Derived(spec_of)

    def claims(self, claims: Iterable[JSON]) -> list[ClaimFacts]:
        """The facts of the claims allocated devices of the driver."""
        return [f for f in self._claims.map(claims) if f is not None]

    def specs(self, resources: Sequence[JSON]) -> dict[str, ComposableResourceSpec]:
        """Resource name -> its spec, for those the schema let through."""
        return {
            meta_of(cr)["name"]: spec
            for cr, spec in zip(resources, self._specs.map(resources), strict=True)
            if spec is not None
        }


def index(s: ScalerSnapshot, cfg: ScalerSettings, memo: Memo | None = None) -> DecisionView:
    """``memo``: what the last pass read (the scaler keeps one per driver); without one,
    every object is read."""
    if memo is None or memo.driver != cfg.driver:
        memo = Memo(cfg.driver)
    resources = {meta_of(cr)["name"]: cr for cr in s.resources}
    specs = memo.specs(s.resources)
    claims = memo.claims(s.claims)
    return DecisionView(s, cfg, resources, specs, block_holders(s.resources, specs), claims)
