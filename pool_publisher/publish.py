"""The pool publisher: network-attached ResourceSlices with the free GPUs of each fabric.

One pool per (Fabric, zone), named ``<fabric>/<zone>`` (names.pool_name), one device per
free GPU block, named after the block. Every device carries ``bindsToNode`` and the binding
(failure) conditions of the attach flow, and the pool's slices select exactly the nodes
whose fabric host the zone reaches. A block that a live claim allocation names stays
published until that allocation ends, even once it is attached (docs/architecture.md, Invariants);
a free block that a ComposableResource holds (being attached outside a pool allocation) is
left out.

The decisions are pure functions (``desired_pools``, ``plan_pools``); ``PoolPublisher``
feeds them from informers and the fabric backends and writes the difference with
server-side apply. Writes happen only when the fields we own differ, so nothing loops.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

from api.v1alpha1 import API_VERSION, FabricSpec, NodeMapping, VendorDriver
from composable_dra.fabric.backend import Device, Inventory
from composable_dra.fabric.errors import FabricError
from composable_dra.fabric.registry import (
    FabricConfigError,
    Fabrics,
    node_mapping_fields,
    spec_version,
)
from composable_dra.fabric.registry import host_nodes as nodes_by_host
from composable_dra.fabric.slots import slot_holds, with_slots
from composable_dra.k8s import events, retry
from composable_dra.k8s.derived import Derived
from composable_dra.k8s.informer import Informer, InformerDriven
from composable_dra.k8s.kept import claim_binding_fields
from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.k8s.quantity import format_bytes, parse_bytes
from composable_dra.k8s.resource_slices import common_fields, touch_slice, write_slices
from composable_dra.k8s.wake import SLICE_WAKES, TOUCH_EVENT, Waker
from composable_dra.model import fence, names
from composable_dra.process import logs
from pool_publisher.claim_use import ClaimUse, claim_use, held, waiting
from pool_publisher.class_clash import ClassClashWatch
from pool_publisher.node_labels import (
    Written,
    apply_body,
    label_writes,
    overlay,
    own_label,
    wanted_labels,
    zone_labels,
)
from pool_publisher.pool_health import COMPONENT, PoolHealth, fence_inventory, health_taints
from pool_publisher.served import EVERYTHING, HELD_BACK_WHY, POOL_HELD_BACK, Served, as_served
from pool_publisher.window import AUTO, WindowPolicy, window_size
from pool_publisher.zone_select import NodeLabel, node_selector, zone_carriers, zone_label

RESOURCE_API = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS = 64
ALLOCATED_TAINT = f"{names.PREFIX}/allocated"
FIELD_MANAGER = "composable-dra-pool-publisher"
MANAGED_LABEL = f"{names.PREFIX}/managed-by"
MANAGED_VALUE = "pool-publisher"
ZONE_LABEL = f"{names.PREFIX}/zone"
_ATTR_MAX = 64
_ATTRIBUTE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

POOL_FREE_DEVICES = Gauge(
    "composable_dra_pool_publisher_free_devices",
    "Free devices published in a fabric pool, by model",
    ["fabric", "zone", "model"],
)
POOL_PUBLISHED_DEVICES = Gauge(
    "composable_dra_pool_publisher_devices",
    "Devices published in a fabric pool (free ones and ones a live allocation holds)",
    ["fabric", "zone"],
)
POOL_WINDOW = Gauge(
    "composable_dra_pool_publisher_window",
    "Free devices each pool offers at most this pass (0: every free device)",
)
PUBLISH_ERRORS = Counter(
    "composable_dra_pool_publisher_errors_total",
    "Failed passes of the pool publisher, by stage",
    ["stage"],
)
NODE_LABEL_WRITES = Counter(
    "composable_dra_pool_publisher_node_label_writes_total",
    "Writes of the publisher's own zone labels to Nodes (node_labels.py)",
)
NODE_LABEL_RETRY_CAP = 60.0  # seconds: the longest wait before a failed node write again

log = logs.get(__name__)


# -- names -------------------------------------------------------------------------------


def _short_hash(value: str, n: int = 8) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:n]


def device_name(block_id: str) -> str:
    """The slice device name of a block: the block id when it is a DNS label, else a
    deterministic DNS label derived from it (the block id stays in the blockID attribute)."""
    if _DNS_LABEL.match(block_id):
        return block_id
    cleaned = re.sub(r"[^a-z0-9]+", "-", block_id.lower()).strip("-")[:50].strip("-")
    return f"{cleaned}-{_short_hash(block_id)}" if cleaned else f"dev-{_short_hash(block_id)}"


def _label(value: str, limit: int = 63) -> str:
    """A DNS label (or label value) for a fabric or zone id."""
    cleaned = re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")
    if cleaned == value and len(cleaned) <= limit:
        return cleaned
    return f"{cleaned[: limit - 9].strip('-')}-{_short_hash(value)}"


def slice_name(fabric: str, zone: str, index: int, vendor: str = "") -> str:
    # A slice's driver is immutable: a vendor pool's slices get names of their own (a
    # digest of the driver), so that switching modes replaces them instead of failing.
    tag = f"-v{_short_hash(vendor, 6)}" if vendor else ""
    suffix = f"-{_label(zone)}{tag}-{index}"
    return fabric[: 253 - len(suffix)] + suffix


# -- desired state (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class FabricView:
    """What the publisher knows of one Fabric when it decides."""

    name: str
    uid: str
    inventory: Inventory
    host_nodes: Mapping[str, Sequence[str]]  # fabric host id -> node names on it
    held: frozenset[str] = frozenset()  # block ids a live ComposableResource holds
    vendor: VendorDriver | None = None  # vendor-driver mode (docs/operations.md)
    # zone id -> its node label and the nodes carrying it (zone_select.py)
    zone_labels: Mapping[str, tuple[NodeLabel, frozenset[str]]] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolSpec:
    fabric: str
    fabric_uid: str
    zone: str
    nodes: tuple[str, ...]
    devices: tuple[Device, ...]
    allocated: frozenset[str] = frozenset()  # block ids a live allocation names
    vendor: VendorDriver | None = None
    label: NodeLabel | None = None  # the one label selecting the nodes, else hostnames

    @property
    def name(self) -> str:
        return names.pool_name(self.fabric, self.zone)


def zone_nodes(hosts: Iterable[str], host_nodes: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """The names of the nodes on a zone's fabric hosts, sorted."""
    return tuple(sorted({n for h in hosts for n in host_nodes.get(h, ())}))


def live_allocations(claims: Iterable[JSON], driver: str) -> set[tuple[str, str]]:
    """(pool, device) of every allocation result of ``driver`` in the claims."""
    return held(map(claim_use, claims), {driver})


def published_devices(slices: Iterable[JSON]) -> frozenset[tuple[str, str]]:
    """(pool, device) of every device in the slices."""
    return frozenset(
        (str(((sl.get("spec") or {}).get("pool") or {}).get("name", "")), str(d.get("name")))
        for sl in slices
        for d in (sl.get("spec") or {}).get("devices") or []
    )


def held_blocks(resources: Iterable[JSON], fabric: str) -> frozenset[str]:
    """Blocks of ``fabric`` that a ComposableResource holds (anything but Detached)."""
    held = set()
    for cr in resources:
        spec = cr.get("spec") or {}
        if spec.get("fabric") != fabric:
            continue
        if (cr.get("status") or {}).get("phase") == "Detached":
            continue
        held.add(str(spec.get("deviceID", "")))
    return frozenset(held)


def attachment_states(resources: Iterable[JSON]) -> frozenset[tuple[str, str, bool]]:
    """(name, phase, deleting) of every ComposableResource: what says the fabric changed."""
    return frozenset(
        (
            str((cr.get("metadata") or {}).get("name", "")),
            str((cr.get("status") or {}).get("phase", "")),
            bool((cr.get("metadata") or {}).get("deletionTimestamp")),
        )
        for cr in resources
    )


def read_again(
    attachments_before: frozenset[tuple[str, str, bool]] | None,
    attachments: frozenset[tuple[str, str, bool]],
    live_before: set[tuple[str, str]],
    live: set[tuple[str, str]],
) -> bool:
    """Whether to read the fabric again before deciding, whatever its poll interval.

    The inventory decides only whether a block that nobody holds is free, so a read is
    needed when a hold ends: a resource gone or Detached (its block may be free again),
    or an allocation ended (its block may go back to "free and held by nobody", which must
    be decided from the fabric as it is now, not from an inventory read before the attach:
    that would put an attached GPU back in the pool). An attach moving on (Attaching,
    Online) changes nothing the pools show: a held block is out whatever the fabric says.
    Reading 4,000 blocks on each of 1,000 attaches was the publisher's quadratic cost
    (docs/attach-flow.md, Scale).
    """
    if attachments_before is None:
        return True

    def holding(states: frozenset[tuple[str, str, bool]]) -> set[str]:
        return {name for name, phase, _ in states if phase != "Detached"}

    return bool(holding(attachments_before) - holding(attachments)) or bool(live_before - live)


def desired_pools(
    view: FabricView,
    live: set[tuple[str, str]],
    max_free: int = 0,
    published: frozenset[tuple[str, str]] = frozenset(),
) -> dict[str, PoolSpec]:
    """The pools of one fabric: per zone that reaches at least one node, its devices.

    A device is in when it is free and no ComposableResource holds it, or when a live
    allocation names it (it keeps its pool identity until that allocation ends).

    With ``max_free`` > 0 a pool offers at most that many free devices: the scheduler
    evaluates every free pool device against a claim's selectors on every node it filters,
    for every pod, so a zone's whole fabric in its pool makes each scheduling attempt cost
    nodes x free devices CEL evaluations (docs/attach-flow.md, Scale). Devices already
    ``published`` ((pool, device) in the pools' slices now) keep their place, so one the
    scheduler just picked is not swapped out before its allocation is seen; each
    allocation rewrites the pool anyway, and that pass puts the next free device in.
    """
    pools: dict[str, PoolSpec] = {}
    inv = view.inventory
    for zone in sorted(inv.zones.values(), key=lambda z: z.id):
        nodes = zone_nodes(zone.hosts, view.host_nodes)
        if not nodes:
            continue
        pool = names.pool_name(view.name, zone.id)
        referenced: list[Device] = []
        free: list[Device] = []
        for block_id in sorted(zone.devices):
            dev = inv.devices.get(block_id)
            if dev is None:
                continue
            if (pool, device_name(dev.id)) in live:
                referenced.append(dev)
            elif dev.state == "free" and dev.id not in view.held:
                free.append(dev)
        if max_free > 0:
            free = sorted(free, key=lambda d: ((pool, device_name(d.id)) not in published, d.id))
            free = free[:max_free]
        devices = sorted([*referenced, *free], key=lambda d: d.id)
        allocated = {d.id for d in referenced}
        label = zone_label(view.zone_labels.get(zone.id), nodes)
        pools[pool] = PoolSpec(
            view.name,
            view.uid,
            zone.id,
            nodes,
            tuple(devices),
            frozenset(allocated),
            view.vendor,
            label,
        )
    return pools


def device_entry(
    fabric: str,
    zone: str,
    dev: Device,
    allocated: bool = False,
    vendor: VendorDriver | None = None,
) -> JSON:
    """One pool device. An allocated one carries a NoSchedule taint: when its allocation
    ends, the scheduler sees it unallocated before this publisher drops it (it may be
    attached by then), and must not hand it to another claim in that moment."""
    product = f"{dev.manufacturer} {dev.model}".strip()
    attributes: dict[str, JSON] = {
        "model": {"string": dev.model[:_ATTR_MAX]},
        "uuid": {"string": dev.uuid[:_ATTR_MAX]},
        "productName": {"string": product[:_ATTR_MAX]},
        "attachment": {"string": "pool"},  # published by the pool, not yet on a node
        "fabric": {"string": fabric[:_ATTR_MAX]},
        "zone": {"string": zone[:_ATTR_MAX]},
        "blockID": {"string": dev.id[:_ATTR_MAX]},
    }
    if vendor is not None:
        attributes = vendor_attributes(attributes, vendor)
    entry: JSON = {
        "name": device_name(dev.id),
        "attributes": attributes,
        "bindsToNode": True,
        "bindingConditions": [names.FABRIC_DEVICE_READY],
        "bindingFailureConditions": [names.FABRIC_DEVICE_FAILED, names.FABRIC_DEVICE_RESCHEDULE],
    }
    taints = health_taints(dev)
    if allocated:
        taints.insert(0, {"key": ALLOCATED_TAINT, "value": "true", "effect": "NoSchedule"})
    if taints:
        entry["taints"] = taints
    if dev.memory_mib:
        entry["capacity"] = {"memory": {"value": format_bytes(dev.memory_mib * 2**20)}}
    return entry


def vendor_attributes(ours: Mapping[str, JSON], vendor: VendorDriver) -> dict[str, JSON]:
    """Our pool attributes under the vendor's names, plus its fixed ones, so that the
    vendor's DeviceClass selects pool devices as it selects its own (an extra wins)."""
    out = {vendor.attribute_names.get(k, k): v for k, v in ours.items()}
    out.update({k: {"string": v[:_ATTR_MAX]} for k, v in vendor.attributes.items()})
    return out


def vendor_config_error(vendor: VendorDriver | None) -> str | None:
    """Why a Fabric's vendorDriver cannot be published, or None (the schema allows any
    map keys; an attribute name must be a C identifier of at most 32 characters)."""
    if vendor is None:
        return None
    for key in [*vendor.attribute_names.values(), *vendor.attributes]:
        if not _ATTRIBUTE_NAME.match(key):
            return f"vendorDriver attribute name {key!r} is not a C identifier of <= 32 chars"
    return None


def pool_slices(
    spec: PoolSpec, generation: int, driver: str, max_per_slice: int = MAX_DEVICES_PER_SLICE
) -> list[JSON]:
    """All slices of a pool at ``generation`` (an empty pool still has one slice)."""
    devices = sorted(spec.devices, key=lambda d: device_name(d.id))
    if spec.allocated or any(d.fault for d in spec.devices):
        max_per_slice = min(max_per_slice, MAX_DEVICES_PER_SLICE_WITH_TAINTS)
    chunks = [devices[i : i + max_per_slice] for i in range(0, len(devices), max_per_slice)] or [[]]
    selector = node_selector(spec.label, spec.nodes)
    return [
        {
            "apiVersion": RESOURCE_API,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(
                    spec.fabric, spec.zone, i, spec.vendor.name if spec.vendor else ""
                ),
                "labels": {
                    MANAGED_LABEL: MANAGED_VALUE,
                    names.LABEL_FABRIC: _label(spec.fabric),
                    ZONE_LABEL: _label(spec.zone),
                },
                "ownerReferences": [
                    {
                        "apiVersion": "composable.dra.io/v1alpha1",
                        "kind": "Fabric",
                        "name": spec.fabric,
                        "uid": spec.fabric_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": spec.vendor.name if spec.vendor else driver,
                "pool": {
                    "name": spec.name,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                "nodeSelector": selector,
                "devices": [
                    device_entry(spec.fabric, spec.zone, d, d.id in spec.allocated, spec.vendor)
                    for d in chunk
                ],
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def _norm_device(dev: JSON) -> tuple[Any, ...]:
    capacity = {
        k: parse_bytes(str((v or {}).get("value", "0")))
        for k, v in (dev.get("capacity") or {}).items()
    }
    return (
        dev.get("name"),
        json.dumps(dev.get("attributes") or {}, sort_keys=True),
        json.dumps(capacity, sort_keys=True),
        bool(dev.get("bindsToNode")),
        tuple(dev.get("bindingConditions") or ()),
        tuple(dev.get("bindingFailureConditions") or ()),
        json.dumps(
            [{k: t.get(k) for k in ("key", "value", "effect")} for t in dev.get("taints") or []],
            sort_keys=True,
        ),
    )


def _norm_slice(obj: JSON) -> tuple[Any, ...]:
    labels, spec, common = common_fields(obj)
    return (
        *common,
        tuple(sorted((k, v) for k, v in labels.items() if k.startswith(names.PREFIX))),
        json.dumps(spec.get("nodeSelector") or {}, sort_keys=True),
        [_norm_device(d) for d in spec.get("devices") or []],
    )


def same_slice(desired: JSON, observed: JSON) -> bool:
    """Equal on the fields we set; fields the server adds or reformats are ignored."""
    return _norm_slice(desired) == _norm_slice(observed)


@dataclass(frozen=True)
class InPlace:
    """A pool found as desired: its spec, generation and slices (name, resourceVersion).

    While neither the spec nor any of those slices changes, the next plan trusts it
    without comparing 4,000 devices again on every pass (docs/attach-flow.md, Scale).
    """

    spec: PoolSpec
    generation: int
    slices: frozenset[tuple[str, str]]


@dataclass
class PoolPlan:
    apply: list[JSON] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    generations: dict[str, int] = field(default_factory=dict)  # pool -> generation now
    in_place: dict[str, InPlace] = field(default_factory=dict)  # pools found as desired

    @property
    def empty(self) -> bool:
        return not self.apply and not self.delete


def slice_versions(observed: Iterable[JSON]) -> frozenset[tuple[str, str]]:
    return frozenset(
        (str(o["metadata"]["name"]), str(o["metadata"].get("resourceVersion") or ""))
        for o in observed
    )


def still_in_place(
    known: InPlace | None, spec: PoolSpec, versions: frozenset[tuple[str, str]], last: int
) -> InPlace | None:
    """``known`` if the pool found as desired before is so still: the same spec, the very
    slices seen then (every one with a resourceVersion), no newer generation written since."""
    if (
        known is not None
        and versions
        and all(rv for _, rv in versions)
        and known.slices == versions
        and last <= known.generation
        and known.spec == spec
    ):
        return known
    return None


def plan_pools(
    desired: Mapping[str, PoolSpec],
    observed: Sequence[JSON],
    driver: str,
    last_generations: Mapping[str, int] | None = None,
    max_per_slice: int = MAX_DEVICES_PER_SLICE,
    in_place: Mapping[str, InPlace] | None = None,
    served: Served = EVERYTHING,
) -> PoolPlan:
    """Slices to apply and delete so the observed pools become the desired ones.

    A changed pool is rewritten whole at a generation above any seen, so no consumer mixes
    two generations of it; an unchanged pool is left alone; a pool no longer desired has its
    slices deleted. ``in_place``: the last plan's ``in_place``. ``served``: what the API
    server keeps of them (pool_publisher/served.py).
    """
    last = dict(last_generations or {})
    known_in_place = in_place or {}
    by_pool: dict[str, list[JSON]] = {}
    for obj in observed:
        by_pool.setdefault(str(((obj.get("spec") or {}).get("pool") or {}).get("name")), []).append(
            obj
        )
    plan = PoolPlan()
    for pool, spec in sorted(desired.items()):
        seen = {o["metadata"]["name"]: o for o in by_pool.get(pool, [])}
        versions = slice_versions(seen.values())
        known = still_in_place(known_in_place.get(pool), spec, versions, last.get(pool, 0))
        if known is not None:
            plan.generations[pool] = known.generation
            plan.in_place[pool] = known
            continue
        current = max(
            [
                last.get(pool, 0),
                *((o["spec"].get("pool") or {}).get("generation", 0) for o in seen.values()),
            ]
        )
        at_current = [
            as_served(b, served) for b in pool_slices(spec, current, driver, max_per_slice)
        ]
        wanted = {s["metadata"]["name"] for s in at_current}
        if (
            current > 0
            and set(seen) == wanted
            and all(same_slice(s, seen[s["metadata"]["name"]]) for s in at_current)
        ):
            plan.generations[pool] = current
            plan.in_place[pool] = InPlace(spec, current, versions)
            continue
        generation = current + 1
        plan.apply.extend(
            as_served(b, served) for b in pool_slices(spec, generation, driver, max_per_slice)
        )
        plan.delete.extend(sorted(set(seen) - wanted))
        plan.generations[pool] = generation
    for pool, objs in sorted(by_pool.items()):
        if pool not in desired:
            plan.delete.extend(sorted(o["metadata"]["name"] for o in objs))
    return plan


def is_fabric_pool(driver: str, pool: str) -> bool:
    """A fabric pool's name, ``<fabric>/<zone>``, of any driver (ours, or a vendor's in
    vendor-driver mode); a node's pool (its name) has no '/'."""
    return "/" in pool


def first_slice(slices: Iterable[JSON], pool: str) -> str | None:
    """The name of the pool's first slice (the one a touch writes), None if it has none."""
    return min(
        (
            str(s["metadata"]["name"])
            for s in slices
            if ((s.get("spec") or {}).get("pool") or {}).get("name") == pool
        ),
        default=None,
    )


def host_nodes(
    nodes: Iterable[JSON], mapping: NodeMapping, inventory: Inventory
) -> dict[str, list[str]]:
    """fabric host id -> names of the nodes that run on it, per the Fabric's nodeMapping."""
    return nodes_by_host(nodes, mapping, inventory.hosts)


def fabric_version(fabric: JSON) -> tuple[str, bool]:
    """What of a Fabric makes its inventory worth reading again: its spec, and whether
    it is being deleted."""
    return spec_version(fabric), bool((fabric.get("metadata") or {}).get("deletionTimestamp"))


def named_labels(spec: FabricSpec) -> dict[str, NodeLabel]:
    """zone id -> the node label the Fabric names for it (``spec.zoneNodeLabels``)."""
    return {z: NodeLabel(lb.key, lb.value) for z, lb in spec.zone_node_labels.items()}


def own_zone_labels(
    fabric: str, spec: FabricSpec, inv: Inventory, hosts: Mapping[str, Sequence[str]]
) -> list[tuple[NodeLabel, tuple[str, ...]]]:
    """(the publisher's label, the zone's nodes) of each zone of the Fabric that reaches a
    node and has no label the Fabric names: the zones whose Nodes the publisher labels."""
    named = spec.zone_node_labels
    out = []
    for zone in sorted(inv.zones.values(), key=lambda z: z.id):
        nodes = zone_nodes(zone.hosts, hosts)
        if nodes and zone.id not in named:
            out.append((own_label(fabric, zone.id), nodes))
    return out


def fabric_view(
    meta: JSON,
    spec: FabricSpec,
    inv: Inventory,
    nodes: Sequence[JSON],
    resources: Sequence[JSON],
    hosts: Mapping[str, Sequence[str]] | None = None,
    own_labels: bool = False,
) -> FabricView:
    """What the decisions need of one Fabric (its metadata, spec and inventory).
    ``hosts``: ``host_nodes`` of the nodes, when already known; ``own_labels``: a zone the
    Fabric names no label for selects by the publisher's own (node_labels.py)."""
    name = str(meta["name"])
    wanted = zone_labels(name, named_labels(spec), inv.zones, own_labels)
    return FabricView(
        name=name,
        uid=meta["uid"],
        inventory=inv,
        host_nodes=host_nodes(nodes, spec.node_mapping, inv) if hosts is None else hosts,
        held=held_blocks(resources, name),
        vendor=spec.vendor_driver,
        zone_labels=zone_carriers(nodes, wanted),
    )


@dataclass(frozen=True)
class FabricRead:
    """A Fabric read in this pass: its metadata, spec, inventory and ``host_nodes``."""

    name: str
    meta: JSON
    spec: FabricSpec
    inv: Inventory
    hosts: dict[str, list[str]]


def free_by_model(pools: Iterable[PoolSpec]) -> dict[tuple[str, str, str], int]:
    counts: dict[tuple[str, str, str], int] = {}
    for p in pools:
        for d in p.devices:
            if d.state == "free":
                key = (p.fabric, p.zone, d.model)
                counts[key] = counts.get(key, 0) + 1
    return counts


# -- the adapter ---------------------------------------------------------------------------


class PoolPublisher(InformerDriven):
    """Keeps the fabric pools' slices equal to ``desired_pools`` of what it observes.

    Informers on Fabrics, Nodes, ResourceClaims, ComposableResources and its own slices wake
    the loop; the fabric is read again at each Fabric's poll interval and promptly after a
    Fabric or a ComposableResource changed (an attach or detach changes what is free).
    """

    thread_name = "pool-publisher"

    def __init__(
        self,
        kube: Kube,
        fabrics: Fabrics,
        driver: str = names.DRIVER,
        max_per_slice: int = MAX_DEVICES_PER_SLICE,
        debounce: float = 0.05,
        max_free: int = AUTO,
        served: Served = EVERYTHING,
        label_nodes: bool = True,
    ) -> None:
        self.kube, self.fabrics, self.driver = kube, fabrics, driver
        self.served = served
        # Label each zone's Nodes with the publisher's own label (node_labels.py).
        self.label_nodes = label_nodes
        self._written: dict[str, Written] = {}  # node -> our last label write to it
        self._label_failures: dict[str, tuple[int, float]] = {}  # node -> (failures, retry at)
        self._told_held_back: set[str] = set()  # claims told why no pool serves them
        self.max_per_slice = max_per_slice
        # Free devices published per pool (0: all; AUTO: sized to the pending claims).
        self.window = WindowPolicy(max_free)
        self._window_size = 0
        self.debounce = debounce
        super().__init__()
        self._dirty: set[str] = set()  # fabrics whose inventory must be read again
        self._all_dirty = True
        self._lock = threading.Lock()
        self._inventories: dict[str, tuple[Inventory, float]] = {}
        self.health = PoolHealth(kube=kube)
        self._generations: dict[str, int] = {}
        self._in_place: dict[str, InPlace] = {}
        wake = self._wake.set
        self._fabric_versions: dict[str, tuple[str, bool]] = {}
        self.fabric_informer = Informer(
            kube, path(API_VERSION, "fabrics"), on_event=self._fabric_event
        )
        # Of Nodes and claims (thousands each), only the fields the decisions read.
        self.node_informer = Informer(kube, path("v1", "nodes"), wake, keep=node_mapping_fields)
        # Pools to touch once the scheduler let go of an allocation it held in flight.
        self._waker = Waker(is_fabric_pool)
        self.claim_informer = Informer(
            kube,
            path(RESOURCE_API, "resourceclaims"),
            wake,
            on_event=self._claim_event,
            keep=claim_binding_fields,
        )
        self.cr_informer = Informer(kube, path(API_VERSION, "composableresources"), wake)
        self._attachments: frozenset[tuple[str, str, bool]] | None = None
        self._live: set[tuple[str, str]] = set()
        # Each claim's allocation or wait, read again only when the claim changed.
        self._claim_uses = Derived(claim_use)
        self.slice_informer = Informer(
            kube,
            path(RESOURCE_API, "resourceslices"),
            wake,
            name="pool-slices",
            labelSelector=f"{MANAGED_LABEL}={MANAGED_VALUE}",
        )
        # Classes that map an extended resource name ours maps too (class_clash.py).
        self.class_clash = ClassClashWatch(kube, driver, wake)
        self.informers = [
            self.fabric_informer,
            self.node_informer,
            self.claim_informer,
            self.cr_informer,
            self.slice_informer,
            self.class_clash.informer,
        ]
        self.synced = threading.Event()

    def _fabric_event(self, kind: str, fabric: JSON) -> None:
        """A Fabric added, gone, being deleted or given a new spec: read the fabrics again.
        Its status, which the operator writes on each of its polls, changes nothing here."""
        name = str(fabric["metadata"]["name"])
        seen = None if kind == "DELETED" else fabric_version(fabric)
        with self._lock:
            changed = self._fabric_versions.get(name) != seen
            if seen is None:
                self._fabric_versions.pop(name, None)
            else:
                self._fabric_versions[name] = seen
            self._all_dirty = self._all_dirty or changed
        if changed:
            self._wake.set()

    def _claim_event(self, kind: str, claim: JSON) -> None:
        # The pass that the same event wakes sees the planned touch through _next_poll_in.
        self._waker.event(kind, claim)

    # -- loop ------------------------------------------------------------------------------

    def _next_poll_in(self) -> float:
        now = time.monotonic()
        waits = [5.0]
        for fabric in self.fabric_informer.items():
            name = fabric["metadata"]["name"]
            interval = float((fabric.get("spec") or {}).get("pollIntervalSeconds") or 30)
            fetched = self._inventories.get(name, (None, 0.0))[1]
            waits.append(max(0.0, fetched + interval - now))
        touch = self._waker.next_in(now)
        if self._label_failures:
            waits.append(max(0.0, min(at for _, at in self._label_failures.values()) - now))
        return min(waits if touch is None else [*waits, touch])

    def _loop(self) -> None:
        self._debounced_passes(
            self._pass,
            every=self._next_poll_in,
            debounce=self.debounce,
            on_error=self._failed,
            # A pass costs O(cluster); during a burst of claims one ran on nearly every
            # allocation (informer.rest_after). Resting, a pass sees several allocations
            # and refills their pools in one write each.
            rest=True,
        )

    def _pass(self) -> None:
        self.reconcile()
        self.synced.set()

    def _failed(self, exc: BaseException, retry_in: float) -> None:
        PUBLISH_ERRORS.labels("reconcile").inc()
        log.warning("pool publishing failed", error=str(exc), retry_in=retry_in)

    def _inventory(self, name: str, interval: float, force: bool) -> tuple[FabricSpec, Inventory]:
        spec, backend = self.fabrics.get(name)
        cached = self._inventories.get(name)
        if cached and not force and time.monotonic() - cached[1] < interval:
            return spec, cached[0]
        try:
            inv = backend.inventory()
        except FabricError as exc:
            PUBLISH_ERRORS.labels("fabric").inc()
            if cached is None:
                raise
            # Keep publishing what was last known; an attach of a stale device fails
            # cleanly (FabricDeviceFailed) and the scheduler tries another.
            log.warning(
                "fabric unreachable; keeping its last inventory", fabric=name, error=str(exc)
            )
            return spec, cached[0]
        inv = self.health.observe(name, inv)
        self._inventories[name] = (inv, time.monotonic())
        return spec, inv

    def _wake_pods(self, plan: PoolPlan) -> None:
        """Touch each pool due a wake-up that this pass did not write (composable_dra/k8s/wake.py):
        a pool rewritten after its time needs nothing more."""
        now = time.monotonic()
        self._waker.written({str(s["spec"]["pool"]["name"]) for s in plan.apply}, now)
        for pool in self._waker.take(now):
            name = first_slice(self.slice_informer.items(), pool)
            if name is not None and touch_slice(self.kube, name):
                SLICE_WAKES.inc()
                log.info(TOUCH_EVENT, pool=pool, slice=name)

    def _window(
        self, claims: list[JSON], uses: list[ClaimUse], drivers: set[str], nodes: int
    ) -> int:
        """This pass's window (pool_publisher/window.py), over the pools of the last plan
        and the cluster's ``nodes``: the pending claims counted are those whose classes
        select a pool's driver."""
        pools = len(self._generations)
        pending_claims = waiting(claims, uses, self.class_clash.selecting(drivers))
        if not self.served.binding_conditions:
            self._tell_held_back(pending_claims)
        pending = len(pending_claims)
        self._window_size = window_size(pending, pools, self._window_size, self.window, nodes=nodes)
        POOL_WINDOW.set(self._window_size)
        return self._window_size

    def _tell_held_back(self, waiting: list[JSON]) -> None:
        """A Warning Event, once, on each waiting claim: no pool GPU serves it on this
        API server (pool_publisher/served.py)."""
        uids = {str(c["metadata"].get("uid", "")): c for c in waiting}
        self._told_held_back &= set(uids)
        for uid, claim in uids.items():
            if uid in self._told_held_back:
                continue
            self._told_held_back.add(uid)
            meta = claim["metadata"]
            namespace = str(meta.get("namespace", ""))
            involved = events.claim_object(meta["name"], namespace, uid)
            events.post(
                self.kube, involved, namespace, "Warning", POOL_HELD_BACK, HELD_BACK_WHY, COMPONENT
            )

    def _read_fabrics(
        self,
        nodes: Sequence[JSON],
        resources: Sequence[JSON],
        live: set[tuple[str, str]],
        force: bool,
    ) -> tuple[list[FabricRead], bool]:
        """Each live Fabric as this pass publishes it, and whether one was skipped (not
        read, or not publishable: its zones, so its node labels, are unknown)."""
        fenced = fence.fenced(resources)
        read: list[FabricRead] = []
        skipped = False
        for fabric in self.fabric_informer.items():
            meta = fabric["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            name = meta["name"]
            interval = float((fabric.get("spec") or {}).get("pollIntervalSeconds") or 30)
            try:
                spec, inv = self._inventory(name, interval, force)
            except (FabricError, FabricConfigError) as exc:
                log.warning("fabric skipped", fabric=name, error=str(exc))
                skipped = True
                continue
            inv = fence_inventory(inv, fenced)
            if inv.free_counts:  # a fabric that picks the GPU: free counts become slots
                mine = {d for p, d in live if p.startswith(f"{name}/")}
                inv = with_slots(inv, slot_holds(resources, name), mine)
            if (why := vendor_config_error(spec.vendor_driver)) is not None:
                PUBLISH_ERRORS.labels("config").inc()
                log.warning("fabric skipped", fabric=name, error=why)
                skipped = True
                continue
            hosts = host_nodes(nodes, spec.node_mapping, inv)
            read.append(FabricRead(str(name), meta, spec, inv, hosts))
        return read, skipped

    def _write_labels(
        self, nodes: list[JSON], wanted: Mapping[str, Mapping[str, str]], keep: bool
    ) -> list[JSON]:
        """Apply the labels of ours that differ (node_labels.label_writes); returns the
        nodes as this pass should see them (``overlay``). A failed write does not fail the
        pass (the pools fall back to hostnames meanwhile): that node is tried again after
        the retry policy's wait, alone."""
        by_name = {str(n["metadata"]["name"]): n for n in nodes}
        self._written = {k: w for k, w in self._written.items() if k in by_name}
        self._label_failures = {k: f for k, f in self._label_failures.items() if k in by_name}
        now = time.monotonic()
        failed: list[str] = []
        error = ""
        for name, labels in sorted(label_writes(nodes, wanted, self._written, keep).items()):
            failures, retry_at = self._label_failures.get(name, (0, 0.0))
            if retry_at > now:
                continue
            node = by_name[name]
            try:
                answer = self.kube.apply(
                    path("v1", "nodes", name), apply_body(node, labels), FIELD_MANAGER
                )
            except KubeError as exc:
                PUBLISH_ERRORS.labels("node-label").inc()
                wait = retry.delay(failures + 1, cap=NODE_LABEL_RETRY_CAP, first=1.0)
                self._label_failures[name] = (failures + 1, now + wait)
                failed.append(name)
                error = str(exc)
                continue
            NODE_LABEL_WRITES.inc()
            self._label_failures.pop(name, None)
            rv = str(node["metadata"].get("resourceVersion") or "")
            self._written[name] = Written(rv, labels, node_mapping_fields(answer))
        if failed:
            log.warning(
                "node labels not written", nodes=failed[:10], failed=len(failed), error=error
            )
        return overlay(nodes, self._written)

    def reconcile(self) -> PoolPlan:
        """One pass: read what is needed, decide, write the difference."""
        self.class_clash.check()
        with self._lock:
            force, self._all_dirty = self._all_dirty, False
        nodes = self.node_informer.items()
        claims = self.claim_informer.items()
        resources = self.cr_informer.items()
        attachments = attachment_states(resources)
        # Vendor-mode pools are allocated under the vendor's driver name (pool names
        # <fabric>/<zone> never clash with a node's pool: node names have no '/').
        drivers = {self.driver} | {
            str(v["name"])
            for f in self.fabric_informer.items()
            if isinstance(v := (f.get("spec") or {}).get("vendorDriver"), dict) and v.get("name")
        }
        uses = self._claim_uses.map(claims)
        live = held(uses, drivers)
        if read_again(self._attachments, attachments, self._live, live):
            force = True
        self._attachments, self._live = attachments, live
        window = self._window(claims, uses, drivers, len(nodes))
        desired: dict[str, PoolSpec] = {}
        published = published_devices(self.slice_informer.items())
        read, skipped = self._read_fabrics(nodes, resources, live, force)
        if self.label_nodes:
            # Before the pools: they select by the labels this pass has just written.
            zones = [z for f in read for z in own_zone_labels(f.name, f.spec, f.inv, f.hosts)]
            nodes = self._write_labels(nodes, wanted_labels(zones), keep=skipped)
        for f in read:
            view = fabric_view(f.meta, f.spec, f.inv, nodes, resources, f.hosts, self.label_nodes)
            desired.update(desired_pools(view, live, window, published))
        observed = self.slice_informer.items()
        plan = plan_pools(
            desired,
            observed,
            self.driver,
            self._generations,
            self.max_per_slice,
            self._in_place,
            self.served,
        )
        write_slices(self.kube, plan.apply, plan.delete, FIELD_MANAGER, observed)
        self._generations, self._in_place = plan.generations, plan.in_place
        self._wake_pods(plan)
        POOL_FREE_DEVICES.clear()
        for (fabric_name, zone, model), count in free_by_model(desired.values()).items():
            POOL_FREE_DEVICES.labels(fabric_name, zone, model).set(count)
        for spec_ in desired.values():
            POOL_PUBLISHED_DEVICES.labels(spec_.fabric, spec_.zone).set(len(spec_.devices))
        if not plan.empty:
            log.info(
                "pools published",
                pools={p: len(s.devices) for p, s in sorted(desired.items())},
                generations=plan.generations,
                applied=len(plan.apply),
                deleted=plan.delete,
            )
        return plan
