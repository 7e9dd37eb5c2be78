"""Warm standby: idle GPUs kept attached to the nodes of a zone before claims arrive.

A Fabric's ``spec.standby`` (api.v1alpha1.StandbyPolicy) asks the scaler to keep K idle
GPUs attached to the nodes of each of the fabric's zones, so that a claim that prefers a
local GPU finds one on its node and binds with no FabricDeviceReady wait. The decisions
here are pure:

- ``standby_size``: K from the recent claim arrivals (arrivals in the window times the
  expected attach time, Little's law: the claims that arrive while one pool GPU would
  attach), clamped to the policy's min and max; zero without a policy;
- ``place``: which nodes of the zone get the new standby GPUs (the node holding the
  fewest idle GPUs first, then the one with the most recent claims, then by name);
- ``plan``: per zone, which idle GPUs the standby keeps (the idle rule leaves them alone),
  which standby GPUs to return at once (more than maxPerZone idle), and which free pool
  blocks to attach to which nodes.

Every idle GPU of the zone counts towards K, whether the standby attached it or a claim
released it, so the standby never holds more idle GPUs than K needs. The scaler reads the
inputs (``zones_of``, ``claim_arrivals``) and turns the plan into ComposableResources
(device_scaler/decide/warm.py: the standby phase); docs/operations.md, Warm standby.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from api.v1alpha1 import StandbyPolicy
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import parse_time
from composable_dra.model import names

# On the ComposableResources the standby creates: told apart in metrics and status.
STANDBY_LABEL = f"{names.PREFIX}/standby"
HOSTNAME_LABEL = "kubernetes.io/hostname"


def standby_size(arrivals: int, policy: StandbyPolicy | None) -> int:
    """K for one zone: arrivals in the window x expected attach time / window, rounded up,
    clamped to minPerZone..maxPerZone (never above max, even were min above it); 0 without
    a policy."""
    if policy is None:
        return 0
    wanted = math.ceil(max(0, arrivals) * policy.attach_seconds / policy.window_seconds)
    return min(policy.max_per_zone, max(policy.min_per_zone, wanted))


def place(
    n: int,
    nodes: Sequence[str],
    held: Mapping[str, int],
    recent: Mapping[str, int],
    fits: Callable[[str], bool] = lambda _node: True,
) -> list[str]:
    """The nodes of ``n`` new standby GPUs, one per GPU: each time the node holding the
    fewest idle GPUs (``held``), then the one with the most recent claims (``recent``),
    then by name; only nodes that ``fits`` (room under a ComposabilityRequest's max)."""
    counts = {node: held.get(node, 0) for node in nodes if fits(node)}
    out: list[str] = []
    for _ in range(max(0, n)):
        if not counts:
            break
        node = min(counts, key=lambda nd: (counts[nd], -recent.get(nd, 0), nd))
        out.append(node)
        counts[node] += 1
    return out


def standby_name(pool: str, device: str) -> str:
    """The standby resource of one pool block: deterministic, so a second pass before the
    informer shows the first one's create finds it (Conflict) instead of making another."""
    digest = hashlib.sha256(f"standby/{pool}/{device}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^a-z0-9-]+", "-", device.lower()).strip("-")[:30].strip("-") or "dev"
    return f"standby-{stem}-{digest}"


# -- inputs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Zone:
    """A fabric pool (``<fabric>/<zone>``) with a standby policy, and its nodes."""

    pool: str
    fabric: str
    nodes: tuple[str, ...]
    policy: StandbyPolicy


@dataclass(frozen=True)
class Arrival:
    """A claim that wanted a fabric GPU in these pools' zones, when it was created."""

    at: float
    pools: frozenset[str]
    node: str | None


@dataclass(frozen=True)
class StandbyInputs:
    zones: tuple[Zone, ...] = ()
    arrivals: tuple[Arrival, ...] = ()


def policies(fabrics: Iterable[JSON]) -> dict[str, StandbyPolicy]:
    """Fabric name -> its standby policy; a Fabric in vendor-driver mode has none (the
    standby GPU would be published by our plugin, which that mode does not run)."""
    out: dict[str, StandbyPolicy] = {}
    for fab in fabrics:
        spec = fab.get("spec") or {}
        if not spec.get("standby") or spec.get("vendorDriver") is not None:
            continue
        try:
            out[str(fab["metadata"]["name"])] = StandbyPolicy.model_validate(spec["standby"])
        except ValidationError:
            continue  # refused by the schema; nothing to keep
    return out


def _hostnames(selector: JSON) -> set[str]:
    out: set[str] = set()
    for term in selector.get("nodeSelectorTerms") or []:
        for req in term.get("matchExpressions") or []:
            if req.get("key") == HOSTNAME_LABEL and req.get("operator") == "In":
                out.update(str(v) for v in req.get("values") or [])
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                out.update(str(v) for v in req.get("values") or [])
    return out


def label_requirements(selector: JSON) -> list[tuple[str, str]]:
    """(key, value) of each one-value ``In`` requirement on another label than the
    hostname: a pool selecting its zone by the Fabric's zoneNodeLabels."""
    return [
        (str(req["key"]), str(req["values"][0]))
        for term in selector.get("nodeSelectorTerms") or []
        for req in term.get("matchExpressions") or []
        if req.get("key") != HOSTNAME_LABEL
        and req.get("operator") == "In"
        and len(req.get("values") or []) == 1
    ]


def zones_of(
    slices: Iterable[JSON],
    by_fabric: Mapping[str, StandbyPolicy],
    labelled: Callable[[str, str], Iterable[str]] = lambda key, value: (),
) -> tuple[Zone, ...]:
    """The zones with a standby policy, from our driver's slices: a fabric pool's slices
    select its nodes (by hostname, which the suite takes as the node's name, or by one
    label: ``labelled(key, value)`` names the nodes carrying it), and only nodes whose
    plugin publishes a slice can show a standby GPU as local."""
    plugin_nodes: set[str] = set()
    selected: dict[str, set[str]] = {}
    for sl in slices:
        spec = sl.get("spec") or {}
        if spec.get("nodeName"):
            plugin_nodes.add(str(spec["nodeName"]))
            continue
        pool = str((spec.get("pool") or {}).get("name", ""))
        if "/" in pool and pool.split("/", 1)[0] in by_fabric and spec.get("nodeSelector"):
            nodes = selected.setdefault(pool, set())
            nodes.update(_hostnames(spec["nodeSelector"]))
            for key, value in label_requirements(spec["nodeSelector"]):
                nodes.update(labelled(key, value))
    return tuple(
        Zone(pool, fabric, tuple(sorted(nodes & plugin_nodes)), by_fabric[fabric])
        for pool, nodes in sorted(selected.items())
        if (fabric := pool.split("/", 1)[0])
    )


def claim_arrivals(
    claims: Iterable[JSON],
    driver: str,
    zones: Sequence[Zone],
    fabric_gpus: Iterable[tuple[str, str]],
    now: float,
) -> dict[str, Arrival]:
    """Claim uid -> its arrival, for the claims allocated a GPU of a standby zone: a
    device of the zone's pool, or a fabric-attached GPU (``fabric_gpus``: (node, local
    device)) on one of the zone's nodes. GPUs a node was built with are no fabric demand."""
    pools_of_node: dict[str, set[str]] = {}
    for z in zones:
        for n in z.nodes:
            pools_of_node.setdefault(n, set()).add(z.pool)
    zone_pools = {z.pool for z in zones}
    attached = set(fabric_gpus)
    out: dict[str, Arrival] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        allocation = (claim.get("status") or {}).get("allocation") or {}
        pools: set[str] = set()
        on = _hostnames(allocation.get("nodeSelector") or {})
        node = next(iter(on)) if len(on) == 1 else None
        for r in (allocation.get("devices") or {}).get("results") or []:
            if r.get("driver") != driver:
                continue
            pool, device = str(r.get("pool")), str(r.get("device"))
            if pool in zone_pools:
                pools.add(pool)
            elif (pool, device) in attached:
                pools |= pools_of_node.get(pool, set())
                node = pool
        if pools and meta.get("uid"):
            at = parse_time(meta.get("creationTimestamp")) or now
            out[str(meta["uid"])] = Arrival(at, frozenset(pools), node)
    return out


# -- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Held:
    """An idle GPU of a zone: Online and serving nobody, or a standby one still attaching."""

    name: str
    pool: str
    node: str
    model: str
    last_used: float
    standby: bool  # attached by the standby (its label)
    attaching: bool


@dataclass(frozen=True)
class FreeBlock:
    pool: str
    device: str  # the pool device's name
    block: str  # the fabric's id
    model: str


@dataclass(frozen=True)
class NewStandby:
    name: str
    fabric: str
    block: FreeBlock
    node: str


@dataclass(frozen=True)
class ZoneState:
    """What the standby wants and holds in one zone."""

    want: int
    held: int  # idle GPUs the standby keeps, attaching ones included


@dataclass(frozen=True)
class Plan:
    create: list[NewStandby] = field(default_factory=list)
    keep: frozenset[str] = frozenset()  # idle resources the idle rule leaves alone
    surplus: list[str] = field(default_factory=list)  # standby GPUs over maxPerZone: return now
    zones: dict[str, ZoneState] = field(default_factory=dict)


def _matches(policy: StandbyPolicy, model: str) -> bool:
    return policy.model is None or policy.model == model


def _room(fits: Callable[[str, str, str], bool], fabric: str, model: str) -> Callable[[str], bool]:
    return lambda node: fits(fabric, node, model)


def plan(
    inputs: StandbyInputs,
    held: Sequence[Held],
    free: Sequence[FreeBlock],
    now: float,
    fits: Callable[[str, str, str], bool] = lambda _fabric, _node, _model: True,
) -> Plan:
    """Per zone: keep the K idle GPUs used most recently (attaching ones first), return the
    standby GPUs beyond maxPerZone at once, and attach free blocks for what is missing.
    ``fits(fabric, node, model)``: a node has room for one more (ComposabilityRequest max)."""
    out = Plan()
    keep: set[str] = set()
    for zone in inputs.zones:
        window = zone.policy.window_seconds
        arrived = [a for a in inputs.arrivals if zone.pool in a.pools and now - a.at <= window]
        want = standby_size(len(arrived), zone.policy)
        idle = sorted(
            (h for h in held if h.pool == zone.pool and _matches(zone.policy, h.model)),
            key=lambda h: (not h.attaching, -h.last_used, h.name),
        )
        kept = idle[:want]
        keep.update(h.name for h in kept)
        standby = [h for h in idle if h.standby and not h.attaching]
        surplus = max(0, sum(1 for h in idle if h.standby) - zone.policy.max_per_zone)
        # Least recently used first; never one the standby keeps.
        for h in sorted(standby, key=lambda h: (h.last_used, h.name)):
            if surplus == 0:
                break
            if h.name not in keep:
                out.surplus.append(h.name)
                surplus -= 1
        missing = want - len(kept)
        blocks = [b for b in free if b.pool == zone.pool and _matches(zone.policy, b.model)]
        recent: dict[str, int] = {}
        for a in arrived:
            if a.node is not None:
                recent[a.node] = recent.get(a.node, 0) + 1
        per_node: dict[str, int] = {}
        for h in idle:
            per_node[h.node] = per_node.get(h.node, 0) + 1
        created = 0
        # Last blocks first: the scheduler's allocator takes a pool's devices first fit,
        # so a standby attach and a claim in flight rarely reach for the same block.
        for block in sorted(blocks, key=lambda b: b.device, reverse=True):
            if created >= missing:
                break
            room = _room(fits, zone.fabric, block.model)
            nodes = place(1, zone.nodes, per_node, recent, room)
            if not nodes:
                continue
            name = standby_name(zone.pool, block.device)
            out.create.append(NewStandby(name, zone.fabric, block, nodes[0]))
            per_node[nodes[0]] = per_node.get(nodes[0], 0) + 1
            created += 1
        out.zones[zone.pool] = ZoneState(want, len(kept) + created)
    return Plan(out.create, frozenset(keep), out.surplus, out.zones)
