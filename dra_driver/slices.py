"""The node's ResourceSlices: what they should be (pure) and a publisher that makes it so.

One pool named after the node, at most 128 devices a slice, every slice of the pool at
the same ``generation`` with the right ``resourceSliceCount``. With lending on
(:class:`LendPolicy`), the pool is partitionable: slices of counter sets (one per GPU, one
for the donor's link) and slices with per-device node selection that hold, for each GPU,
the local device and one remote-lease device, both consuming the GPU's counter, so the
scheduler never allocates a GPU locally and remotely at once and never grants more leases
than the link's knee (docs/architecture.md, Lending a GPU). The comparison of desired
and observed slices looks only at the fields we set, with quantities compared by value,
so fields the server adds, drops or reformats never start an update loop.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from composable_dra.k8s import retry
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kept import claim_binding_fields
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.k8s.quantity import format_bytes, parse_bytes
from composable_dra.k8s.resource_slices import common_fields, touch_slice, write_slices
from composable_dra.k8s.wake import SLICE_WAKES, TOUCH_EVENT, Waker
from composable_dra.lending import netaware
from composable_dra.model.health import HealthReport
from composable_dra.model.names import normalize_uuid
from composable_dra.process import logs
from dra_driver import health_taints, metrics
from dra_driver.device_source import DeviceInfo

RESOURCE_API = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
# API limits for partitionable pools (resource.k8s.io/v1, Kubernetes v1.37).
MAX_COUNTER_DEVICES_PER_SLICE = 64
MAX_COUNTER_SETS_PER_SLICE = 8
FIELD_MANAGER = "composable-dra-plugin"
MANAGED_LABEL = "composable.dra.io/managed-by"
MANAGED_VALUE = "kubelet-plugin"
# Slices with per-device node selection have no spec.nodeName to select them by.
POOL_LABEL = "composable.dra.io/pool-node"
NETWORK_DOMAIN_LABEL = "composable.dra.io/network-domain"
REMOTE_READY = "RemoteGPUReady"
REMOTE_FAILED = "RemoteGPUFailed"
REMOTE_TRANSPORTS = ("tcp", "ucx")  # shm needs the same node, so it is never lent

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_LABEL_KEY_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class LendPolicyError(ValueError):
    """A lending flag that cannot describe a valid policy."""


def _label_key_ok(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return bool(_LABEL_KEY_NAME.match(name)) and (
        not prefix or (len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.match(prefix)))
    )


@dataclass(frozen=True)
class LendPolicy:
    """What a donor lends and to whom.

    ``borrowers`` are node label equalities (all must hold); empty means every node in the
    donor's network domain. The donor itself never borrows its own GPU.
    """

    network_domain: str
    link_gbps: int
    max_leases: int
    transports: tuple[str, ...] = ("tcp",)
    borrowers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.network_domain or not _LABEL_VALUE.match(self.network_domain):
            raise LendPolicyError(
                f"network domain {self.network_domain!r} is not a label value "
                "(at most 63 characters: letters, digits, '-', '_', '.')"
            )
        if self.link_gbps < 1:
            raise LendPolicyError(f"link Gbit/s must be at least 1, not {self.link_gbps}")
        if self.max_leases < 1:
            raise LendPolicyError(f"max leases must be at least 1, not {self.max_leases}")
        if not self.transports or any(t not in REMOTE_TRANSPORTS for t in self.transports):
            raise LendPolicyError(
                f"transports {list(self.transports)} must be some of {list(REMOTE_TRANSPORTS)}"
            )
        for key, value in self.borrowers:
            if not _label_key_ok(key) or not _LABEL_VALUE.match(value):
                raise LendPolicyError(f"borrower selector {key}={value} is not a node label")

    @classmethod
    def parse_borrowers(cls, text: str) -> tuple[tuple[str, str], ...]:
        """``key=value[,key=value]`` (equality only) into pairs."""
        pairs = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq or not key.strip():
                raise LendPolicyError(f"borrower selector {part!r} is not key=value")
            pairs.append((key.strip(), value.strip()))
        return tuple(pairs)

    def borrower_selector(self, donor: str) -> dict[str, Any]:
        """A node selector term: the borrowers, never the donor."""
        labels = self.borrowers or ((NETWORK_DOMAIN_LABEL, self.network_domain),)
        return {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": k, "operator": "In", "values": [v]} for k, v in labels
                    ],
                    "matchFields": [
                        {"key": "metadata.name", "operator": "NotIn", "values": [donor]}
                    ],
                }
            ]
        }


Attrs = tuple[tuple[str, int], ...]  # sorted (name, value) pairs


@dataclass(frozen=True)
class QosAttributes:
    """The QoS attributes (``qos.published``) a lending host publishes, with
    --host-slowdown-at-full: ``local``/``remote`` on its one open GPU, the lowest-named
    one no claim or lease holds; ``closed_local``/``closed_remote`` (``qos.closed``, no
    headroom) on the others, so the scheduler cannot hand several claims the same headroom
    before the next publication. ``held``: the device names held now (local GPUs prepared
    here, remote devices leased)."""

    local: Attrs = ()
    remote: Attrs = ()
    closed_local: Attrs = ()
    closed_remote: Attrs = ()
    held: tuple[str, ...] = ()

    def open_gpu(self, devices: Sequence[DeviceInfo]) -> str | None:
        """The GPU that carries the headroom: the first of ``devices`` not held."""
        held = set(self.held)
        return next(
            (
                d.name
                for d in devices
                if d.name not in held and remote_device_name(d.name) not in held
            ),
            None,
        )


@dataclass(frozen=True)
class LendState:
    """What the donor measured, as its slices publish it (docs/lending-policy.md): the
    link-busy taint on its remote devices, and the lease capacity that keeps every
    admitted latency SLO (None: the link's knee alone)."""

    busy: bool = False
    leases: int | None = None
    qos: QosAttributes = QosAttributes()


def with_qos(entry: dict[str, Any], attrs: Attrs) -> dict[str, Any]:
    """``entry`` with the QoS attributes added (integers, in the driver's domain)."""
    entry["attributes"].update((name, {"int": value}) for name, value in attrs)
    return entry


def link_leases(policy: LendPolicy, state: LendState) -> int:
    """The link counter's ``leases``: the knee, or less where an admitted SLO needs it."""
    if state.leases is None:
        return policy.max_leases
    return max(0, min(policy.max_leases, state.leases))


def device_entry(dev: DeviceInfo) -> dict[str, Any]:
    """One device of a slice: attributes and capacity (docs/architecture.md)."""
    attributes: dict[str, dict[str, Any]] = {
        "uuid": {"string": dev.uuid},
        "attachment": {"string": dev.attachment},
    }
    if dev.product_name:
        attributes["productName"] = {"string": dev.product_name[:64]}
    if dev.model:
        attributes["model"] = {"string": dev.model[:64]}
    if dev.pci_bus_id:
        attributes["pciBusID"] = {"string": dev.pci_bus_id}
    entry: dict[str, Any] = {"name": dev.name, "attributes": attributes}
    if dev.memory_bytes is not None:
        entry["capacity"] = {"memory": {"value": format_bytes(dev.memory_bytes)}}
    return entry


def pool_label_value(node_name: str) -> str:
    """The node name when it is a label value, else a digest of it (node names reach 253)."""
    if _LABEL_VALUE.match(node_name):
        return node_name
    return "h-" + hashlib.sha256(node_name.encode()).hexdigest()[:40]


def remote_device_name(local: str) -> str:
    suffix = "-remote"
    if len(local) + len(suffix) <= 63:
        return local + suffix
    digest = hashlib.sha256(local.encode()).hexdigest()[:8]
    return f"{local[:47].rstrip('-')}-{digest}{suffix}"


def link_counter_set(devices: Sequence[DeviceInfo]) -> str:
    """``link``, unless a GPU's counter set (named after the device) already has the name."""
    taken = {d.name for d in devices}
    name, i = "link", 0
    while name in taken:
        i += 1
        name = f"link-{i}"
    return name


def remote_entry(
    dev: DeviceInfo,
    donor: str,
    policy: LendPolicy,
    link_set: str,
    busy: bool = False,
    qos: Attrs = (),
) -> dict[str, Any]:
    """The remote-lease device of one GPU: its model, where it is, how it is reached, its
    QoS attributes; tainted ``composable.dra.io/link-busy`` while the donor's link is busy."""
    local = device_entry(dev)
    attributes = {k: v for k, v in local["attributes"].items() if k != "pciBusID"}
    attributes.update(
        attachment={"string": "remote"},
        donorNode={"string": donor[:64]},
        transports={"string": ",".join(policy.transports)},
        linkGbps={"int": policy.link_gbps},
        networkDomain={"string": policy.network_domain},
    )
    entry: dict[str, Any] = {
        "name": remote_device_name(dev.name),
        "attributes": attributes,
        "nodeSelector": policy.borrower_selector(donor),
        "consumesCounters": [
            {"counterSet": dev.name, "counters": {"gpu": {"value": "1"}}},
            {"counterSet": link_set, "counters": {"leases": {"value": "1"}}},
        ],
        # The pod binds once the lease is open (the lease controller, later work).
        "bindsToNode": True,
        "bindingConditions": [REMOTE_READY],
        "bindingFailureConditions": [REMOTE_FAILED],
    }
    if "capacity" in local:
        entry["capacity"] = local["capacity"]
    with_qos(entry, qos)
    taint = netaware.device_taint(busy)
    if taint is not None:
        entry["taints"] = [taint]
    return entry


def lendable(dev: DeviceInfo, keep: Collection[str]) -> bool:
    """Only the node's own GPUs: one the fabric attached (a ComposableResource names it,
    ``keep``) may be taken back by the scaler or the operator, so it is never lent."""
    return dev.attachment == "local" and normalize_uuid(dev.uuid) not in keep


def lend_layout(
    donor: str,
    devices: Sequence[DeviceInfo],
    policy: LendPolicy,
    keep: Collection[str] = frozenset(),
    max_per_slice: int = MAX_DEVICES_PER_SLICE,
    state: LendState = LendState(),
) -> list[dict[str, Any]]:
    """The specs (without pool and driver) of a lending pool.

    Counter slices; per lent GPU its local device (with its node) and its remote-lease
    device, both consuming the GPU's counter, in slices with per-device node selection;
    the GPUs not lent in plain slices of the node, as without lending, so whoever finds a
    node's devices by ``spec.nodeName`` still finds every GPU the fabric may take back.
    A GPU whose remote name is taken by another device is published, but not lent.
    """
    ordered = sorted(devices, key=lambda d: d.name)
    link_set = link_counter_set(ordered)
    names = {d.name for d in ordered}
    sets: list[dict[str, Any]] = [
        {"name": link_set, "counters": {"leases": {"value": str(link_leases(policy, state))}}}
    ]
    pairs: list[dict[str, Any]] = []
    plain: list[DeviceInfo] = []
    q = state.qos
    open_gpu = q.open_gpu(ordered)

    def local_qos(dev: DeviceInfo) -> Attrs:
        return q.local if dev.name == open_gpu else q.closed_local

    for dev in ordered:
        if not lendable(dev, keep) or remote_device_name(dev.name) in names:
            plain.append(dev)
            continue
        remote_qos = q.remote if dev.name == open_gpu else q.closed_remote
        local = with_qos(device_entry(dev), local_qos(dev))
        local["nodeName"] = donor
        local["consumesCounters"] = [{"counterSet": dev.name, "counters": {"gpu": {"value": "1"}}}]
        sets.append({"name": dev.name, "counters": {"gpu": {"value": "1"}}})
        pairs.extend([local, remote_entry(dev, donor, policy, link_set, state.busy, remote_qos)])
    # Even sizes keep a GPU's two devices in one slice.
    step = MAX_COUNTER_DEVICES_PER_SLICE
    return [
        *(
            {"nodeName": donor, "sharedCounters": sets[i : i + MAX_COUNTER_SETS_PER_SLICE]}
            for i in range(0, len(sets), MAX_COUNTER_SETS_PER_SLICE)
        ),
        *(
            {"perDeviceNodeSelection": True, "devices": pairs[i : i + step]}
            for i in range(0, len(pairs), step)
        ),
        *(
            {
                "nodeName": donor,
                "devices": [
                    with_qos(device_entry(d), local_qos(d)) for d in plain[i : i + max_per_slice]
                ],
            }
            for i in range(0, len(plain), max_per_slice)
        ),
    ]


def slice_name(node_name: str, driver: str, index: int) -> str:
    # A DNS subdomain: node names and driver names are subdomains themselves.
    suffix = f"-{driver}-{index}"
    return node_name[: 253 - len(suffix)] + suffix


def desired_slices(
    node_name: str,
    node_uid: str,
    driver: str,
    devices: Sequence[DeviceInfo],
    generation: int,
    max_per_slice: int = MAX_DEVICES_PER_SLICE,
    lend: LendPolicy | None = None,
    keep: Collection[str] = frozenset(),
    state: LendState = LendState(),
    health: Mapping[str, HealthReport] | None = None,
) -> list[dict[str, Any]]:
    """The full set of slices for the node's pool at ``generation``; an unhealthy device
    (and its remote-lease twin) carries its health taints.

    No devices still gives one (empty) slice, so the pool and its generation stay visible.
    """
    if lend is not None:
        layout = lend_layout(node_name, devices, lend, keep, max_per_slice, state)
    else:
        ordered = sorted(devices, key=lambda d: d.name)
        chunks = [
            ordered[i : i + max_per_slice] for i in range(0, len(ordered), max_per_slice)
        ] or [[]]
        layout = [
            {"nodeName": node_name, "devices": [device_entry(d) for d in chunk]} for chunk in chunks
        ]
    if health:
        twins = {remote_device_name(n): r for n, r in health.items()}
        layout = health_taints.apply(layout, {**health, **twins})
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node_name, driver, i),
                "labels": {MANAGED_LABEL: MANAGED_VALUE, POOL_LABEL: pool_label_value(node_name)},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": node_name,
                        "uid": node_uid,
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "driver": driver,
                "pool": {
                    "name": node_name,
                    "generation": generation,
                    "resourceSliceCount": len(layout),
                },
                **spec,
            },
        }
        for i, spec in enumerate(layout)
    ]


def _norm_counters(counters: Any) -> dict[str, int]:
    return {k: parse_bytes(str((v or {}).get("value", "0"))) for k, v in (counters or {}).items()}


def _norm_devices(devices: Any) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for dev in devices or []:
        capacity = {
            k: parse_bytes(str((v or {}).get("value", "0")))
            for k, v in (dev.get("capacity") or {}).items()
        }
        placement = {
            "nodeName": dev.get("nodeName"),
            "nodeSelector": dev.get("nodeSelector"),
            "consumesCounters": [
                (c.get("counterSet"), _norm_counters(c.get("counters")))
                for c in dev.get("consumesCounters") or []
            ],
            "bindsToNode": bool(dev.get("bindsToNode")),
            "bindingConditions": dev.get("bindingConditions") or [],
            "bindingFailureConditions": dev.get("bindingFailureConditions") or [],
            # The server adds timeAdded: compare what we set.
            "taints": sorted(
                (str(t.get("key")), str(t.get("value", "")), str(t.get("effect")))
                for t in dev.get("taints") or []
            ),
        }
        out.append(
            (
                str(dev.get("name")),
                json.dumps(dev.get("attributes") or {}, sort_keys=True),
                json.dumps(capacity, sort_keys=True),
                json.dumps(placement, sort_keys=True),
            )
        )
    return out


def _norm_slice(obj: dict[str, Any]) -> tuple[Any, ...]:
    labels, spec, common = common_fields(obj)
    return (
        *common,
        labels.get(MANAGED_LABEL),
        labels.get(POOL_LABEL),
        spec.get("nodeName"),
        bool(spec.get("perDeviceNodeSelection")),
        [
            (c.get("name"), _norm_counters(c.get("counters")))
            for c in spec.get("sharedCounters") or []
        ],
        _norm_devices(spec.get("devices")),
    )


def same_slice(desired: dict[str, Any], observed: dict[str, Any]) -> bool:
    """Equal on the fields we set; anything the server added is ignored."""
    return _norm_slice(desired) == _norm_slice(observed)


@dataclass
class SlicePlan:
    generation: int
    apply: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.apply and not self.delete


def plan_slices(
    node_name: str,
    node_uid: str,
    driver: str,
    devices: Sequence[DeviceInfo],
    observed: Sequence[dict[str, Any]],
    last_generation: int = 0,
    lend: LendPolicy | None = None,
    keep: Collection[str] = frozenset(),
    state: LendState = LendState(),
    health: Mapping[str, HealthReport] | None = None,
) -> SlicePlan:
    """What to apply and delete so the observed slices become the desired ones.

    Any change rewrites every slice of the pool at a generation above everything seen, so
    no consumer ever mixes slices of two generations.
    """
    observed_by_name = {o["metadata"]["name"]: o for o in observed}
    current = max(
        [
            last_generation,
            *((o.get("spec") or {}).get("pool", {}).get("generation", 0) for o in observed),
        ]
    )
    at_current = desired_slices(
        node_name,
        node_uid,
        driver,
        devices,
        current,
        lend=lend,
        keep=keep,
        state=state,
        health=health,
    )
    names = {s["metadata"]["name"] for s in at_current}
    if (
        current > 0
        and set(observed_by_name) == names
        and all(same_slice(s, observed_by_name[s["metadata"]["name"]]) for s in at_current)
    ):
        return SlicePlan(current)
    generation = current + 1
    return SlicePlan(
        generation,
        apply=desired_slices(
            node_name,
            node_uid,
            driver,
            devices,
            generation,
            lend=lend,
            keep=keep,
            state=state,
            health=health,
        ),
        delete=sorted(set(observed_by_name) - names),
    )


class SlicePublisher:
    """Keeps the node's slices equal to the device list: on change, on deletion, on resync.

    A watch on the slices of this node and driver wakes the reconciler, so a slice deleted
    by someone else comes back within a second; applies use server-side apply.
    """

    def __init__(
        self,
        kube: Kube,
        node_name: str,
        node_uid: str,
        driver: str,
        resync_seconds: float = 300.0,
        lend: LendPolicy | None = None,
        taints: bool = True,
    ) -> None:
        self._kube = kube
        # Whether the API server keeps device taints: without them (v1.35) a health taint
        # would be dropped on every write and the slices rewritten on every pass.
        self.taints = taints
        self.node_name, self.node_uid, self.driver = node_name, node_uid, driver
        self.lend = lend
        self._selector = f"spec.nodeName={node_name},spec.driver={driver}"
        # Every slice we write carries the pool label; slices of older versions only have
        # spec.nodeName, so the list looks both ways and the watch by label.
        self._label_selector = f"{POOL_LABEL}={pool_label_value(node_name)}"
        self._resync = resync_seconds
        self._devices: list[DeviceInfo] | None = None
        self._keep: frozenset[str] = frozenset()
        self._state = LendState()
        self._health: dict[str, HealthReport] = {}
        self._generation = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # Wakes the reconciler on every change of this pool's slices (and after a relist:
        # events may have been missed); the reconciler reads the slices itself.
        self._watch = Informer(
            kube,
            path(RESOURCE_API, "resourceslices"),
            self._wake.set,
            name=f"slices-{node_name}",
            watch_timeout=300,
            fieldSelector=f"spec.driver={driver}",
            labelSelector=self._label_selector,
        )
        # A lent GPU's remote device has a binding condition: when the scheduler lets go
        # of an allocation of it that it held in flight, pods that wait for a GPU are woken
        # by one touch of this pool (composable_dra/k8s/wake.py). Only a lending node watches
        # claims for that; its own local devices have no binding conditions.
        self._waker = Waker(lambda drv, pool: drv == driver and pool == node_name)
        self._claims = (
            Informer(
                kube,
                path(RESOURCE_API, "resourceclaims"),
                name=f"claims-{node_name}",
                on_event=self._claim_event,
                keep=claim_binding_fields,
            )
            if lend is not None
            else None
        )
        self._log = logs.get(__name__, node=node_name)
        self.synced = threading.Event()

    def set_devices(
        self, devices: Sequence[DeviceInfo], keep: Collection[str] = frozenset()
    ) -> None:
        """The devices to publish; ``keep``: UUIDs of GPUs never to lend."""
        self._devices, self._keep = list(devices), frozenset(keep)
        self._wake.set()

    def set_health(self, states: Mapping[str, HealthReport]) -> None:
        """The devices' health (their taints); republish on change. Not published where
        the server keeps no device taints (docs/operations.md, Support matrix)."""
        if self.taints and dict(states) != self._health:
            self._health = dict(states)
            self._wake.set()

    def set_lend_state(self, state: LendState) -> None:
        """What the donor measured (the taint, the lease counter); republish on change."""
        if state != self._state:
            self._state = state
            self._wake.set()

    def start(self) -> None:
        t = threading.Thread(target=self._reconcile_loop, name="slices", daemon=True)
        t.start()
        self._threads.append(t)
        self._watch.start()
        if self._claims is not None:
            self._claims.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._watch.stop()
        if self._claims is not None:
            self._claims.stop()
        if self._threads:
            self._threads[0].join(timeout=5)

    # -- reconcile ---------------------------------------------------------------------

    def _list_labelled(self) -> list[dict[str, Any]]:
        body = self._kube.get(
            path(RESOURCE_API, "resourceslices"),
            fieldSelector=f"spec.driver={self.driver}",
            labelSelector=self._label_selector,
        )
        # The label may be a digest: keep only this node's pool.
        items = [
            o
            for o in body.get("items") or []
            if ((o.get("spec") or {}).get("pool") or {}).get("name") == self.node_name
        ]
        return items

    def _list(self) -> list[dict[str, Any]]:
        by_node = self._kube.get(path(RESOURCE_API, "resourceslices"), fieldSelector=self._selector)
        labelled = self._list_labelled()
        merged = {o["metadata"]["name"]: o for o in by_node.get("items") or []}
        merged.update((o["metadata"]["name"], o) for o in labelled)
        return list(merged.values())

    def reconcile(self) -> SlicePlan | None:
        """One pass; None until the device source has reported once."""
        if self._devices is None:
            return None
        devices, keep = self._devices, self._keep
        observed = self._list()
        plan = plan_slices(
            self.node_name,
            self.node_uid,
            self.driver,
            devices,
            observed,
            self._generation,
            lend=self.lend,
            keep=keep,
            state=self._state,
            health=self._health,
        )
        write_slices(self._kube, plan.apply, plan.delete, FIELD_MANAGER, observed)
        self._generation = plan.generation
        if plan.apply:
            self._waker.written([self.node_name], time.monotonic())
        metrics.DEVICES_PUBLISHED.set(len(devices))
        if not plan.empty:
            self._log.info(
                "slices published",
                generation=plan.generation,
                slices=len(plan.apply),
                deleted=plan.delete,
                devices=len(devices),
                link_busy=self._state.busy,
                qos=dict(self._state.qos.remote or self._state.qos.local) or None,
            )
        return plan

    def _claim_event(self, kind: str, claim: JSON) -> None:
        if self._waker.event(kind, claim):
            self._wake.set()  # the loop's next wait ends at the touch's time

    def _reconcile_loop(self) -> None:
        while not self._stop.is_set():
            touch = self._waker.next_in()
            self._wake.wait(self._resync if touch is None else min(self._resync, touch))
            self._wake.clear()
            if self._stop.is_set():
                return
            retry.forever(self._reconcile_once, self._stop, cap=10.0, on_error=self._failed)

    def _reconcile_once(self) -> None:
        if self.reconcile() is not None and not self.synced.is_set():
            self.synced.set()
            self._log.info("slices in sync", generation=self._generation)
        for _ in self._waker.take():  # this pool, after its rewrite (if any) counted
            name = slice_name(self.node_name, self.driver, 0)
            if touch_slice(self._kube, name):
                SLICE_WAKES.inc()
                self._log.info(TOUCH_EVENT, slice=name)

    def _failed(self, exc: BaseException, retry_in: float) -> None:
        metrics.RECONCILE_ERRORS.inc()
        self._log.warning("publishing slices failed", error=str(exc), retry_in=retry_in)
