"""The Dynamic Device Scaler's adapter: informers in, ``decide`` in the middle, writes out.

Informers keep ResourceClaims, ComposableResources, our driver's ResourceSlices,
ComposabilityRequests and the scaler's quarantine DeviceTaintRules in memory; any change
wakes one reconcile thread, which builds a snapshot, asks ``decide.decide`` what to do and
does it. Every write is idempotent (deterministic names, server-side apply of the claim's
device status, deletes that tolerate NotFound), so acting twice on a stale cache is
harmless, and a restart picks up where the last leader stopped.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from api.v1alpha1 import API_VERSION, ClaimRef, ComposableResourceSpec
from composable_dra.k8s import kube_json
from composable_dra.k8s.derived import Derived
from composable_dra.k8s.events import claim_object, event_body
from composable_dra.k8s.informer import Informer, InformerDriven
from composable_dra.k8s.kept import node_labels, own_slice_fields
from composable_dra.k8s.kube import JSON, Conflict, Kube, KubeError, NotFound, path
from composable_dra.model import names
from composable_dra.model.names import (
    ANN_IN_USE_BY,
    ANN_POOL,
    ANN_POOL_DEVICE,
    QUARANTINE_LABEL,
    normalize_uuid,
)
from composable_dra.process import logs
from device_scaler import pool_gauges
from device_scaler import standby as sb
from device_scaler.claim_status import apply_devices
from device_scaler.decide import (
    CreateResource,
    DeleteResource,
    Memo,
    PatchResource,
    Quarantine,
    ScalerSettings,
    ScalerSnapshot,
    SetDeviceStatus,
    Unquarantine,
    decide,
    managed,
    quarantine_body,
    quarantine_rule_name,
)
from device_scaler.unseen import Unseen, hold_back
from device_scaler.vendor import (
    Rescheduled,
    RestartVendorPlugin,
    VendorMode,
    complete_vendor,
    fabric_of,
    vendor_modes,
)

RESOURCE_API = "resource.k8s.io/v1"
# The pool publisher's label on its slices (pool_publisher.publish.MANAGED_LABEL).
POOL_MANAGED_LABEL = f"{names.PREFIX}/managed-by"
POOL_MANAGED_VALUE = "pool-publisher"
FIELD_MANAGER = "composable-dra-scaler"
COMPONENT = "composable-dra-scaler"

TIME_TO_GPU = Histogram(
    "composable_dra_time_to_gpu_seconds",
    "From a claim's pool allocation to FabricDeviceReady on it",
    buckets=(0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300),
)
ATTACH_FAILURES = Counter(
    "composable_dra_scaler_attach_failures_total",
    "Pool allocations failed with FabricDeviceFailed, by reason",
    ["reason"],
)
ACTIONS = Counter("composable_dra_scaler_actions_total", "Actions taken, by kind", ["kind"])
IDLE_DEVICES = Gauge(
    "composable_dra_scaler_idle_devices", "Attached GPUs serving no claim, by node", ["node"]
)
STANDBY_IDLE = Gauge(
    "composable_dra_scaler_standby_idle",
    "Idle GPUs a warm standby holds attached (attaching ones included), by fabric pool",
    ["pool"],
)
STANDBY_TARGET = Gauge(
    "composable_dra_scaler_standby_target",
    "How many idle GPUs the warm standby wants in the zone now (K), by fabric pool",
    ["pool"],
)
RECONCILE_ERRORS = Counter(
    "composable_dra_scaler_reconcile_errors_total", "Failed scaler passes or actions"
)

log = logs.get(__name__)

# Action kinds of which a run may be written concurrently (each touches its own object).
_CONCURRENT = (CreateResource, SetDeviceStatus)


@dataclass
class ScalerConfig:
    settings: ScalerSettings
    resync: float = 1.0  # seconds between passes without events (timeouts, idle windows)
    debounce: float = 0.02
    # The only namespace whose pods vendor-driver mode may delete (None: any).
    vendor_plugin_namespace: str | None = None
    # Whether the API server serves resource.k8s.io/v1 DeviceTaintRules (the start's probe):
    # without them (v1.35, v1.36) nothing is quarantined, and nothing is watched that
    # would only answer 404 (the first pass waits for every informer's first list).
    taint_rules: bool = True


def standby_held(resources: list[JSON]) -> dict[str, int]:
    """Pool -> standby GPUs serving nobody: attaching, or Online with no claim and no
    local allocation (the in-use mark), and not being deleted."""
    out: dict[str, int] = {}
    for cr in resources:
        meta = cr.get("metadata") or {}
        if sb.STANDBY_LABEL not in (meta.get("labels") or {}) or meta.get("deletionTimestamp"):
            continue
        ann = meta.get("annotations") or {}
        if (cr.get("spec") or {}).get("claimRef") or ann.get(ANN_IN_USE_BY):
            continue
        if (cr.get("status") or {}).get("phase") in (None, "Attaching", "Online"):
            pool = str(ann.get(ANN_POOL, ""))
            out[pool] = out.get(pool, 0) + 1
    return out


def _pipelined(action: Any) -> bool:
    """A write on an attach's path that no other write of the pass must precede or
    follow: a claim's resource, or FabricDeviceReady alone on its status."""
    if isinstance(action, CreateResource):
        return True
    if not isinstance(action, SetDeviceStatus) or action.failed:
        return False
    return all(
        c.get("type") == names.FABRIC_DEVICE_READY
        for e in action.entries
        for c in e.get("conditions") or []
    )


@dataclass(frozen=True)
class SliceDevices:
    """What a pass reads of one ResourceSlice."""

    pool: dict[tuple[str, str], JSON]  # (pool, device) -> a fabric pool's device
    local: dict[tuple[str, str], str]  # (node, normalized uuid) -> a node's own device


def slice_devices(sl: JSON) -> SliceDevices:
    out = SliceDevices({}, {})
    spec = sl.get("spec") or {}
    pool = str((spec.get("pool") or {}).get("name", ""))
    node = spec.get("nodeName")
    per_device = bool(spec.get("perDeviceNodeSelection"))
    for dev in spec.get("devices") or []:
        uuid_attr = ((dev.get("attributes") or {}).get("uuid") or {}).get("string")
        if per_device:
            # A lending node's pool: its GPUs carry their node; a remote-lease device (a
            # nodeSelector) is no fabric pool's and not a local GPU.
            if dev.get("nodeName") and uuid_attr:
                out.local[(str(dev["nodeName"]), normalize_uuid(uuid_attr))] = dev["name"]
        elif node:
            if uuid_attr:
                out.local[(node, normalize_uuid(uuid_attr))] = dev["name"]
        else:
            out.pool[(pool, dev["name"])] = dev
    return out


def _version(obj: JSON | None) -> str | None:
    return None if obj is None else str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _claim_of(resources: list[JSON]) -> Callable[[str], str | None]:
    """Resource name -> the uid of the claim it serves."""
    by_name = {cr["metadata"]["name"]: cr for cr in resources}

    def claim_of(name: str) -> str | None:
        ref = ((by_name.get(name) or {}).get("spec") or {}).get("claimRef") or {}
        return ref.get("uid")

    return claim_of


class Scaler(InformerDriven):
    thread_name = "scaler"

    def __init__(self, kube: Kube, config: ScalerConfig) -> None:
        super().__init__()
        self.kube = kube
        self.config = config
        self.settings = config.settings
        self._events_sent: set[tuple[str, str, str]] = set()
        self._events_lock = threading.Lock()
        wake = self._wake.set
        driver = self.settings.driver
        self.claims = Informer(
            kube, path(RESOURCE_API, "resourceclaims"), wake, on_event=self._claim_seen
        )
        self.resources = Informer(kube, path(API_VERSION, "composableresources"), wake)
        self.slices = Informer(
            kube,
            path(RESOURCE_API, "resourceslices"),
            wake,
            keep=own_slice_fields,  # 1,000 nodes' slices: only their GPUs' UUIDs
            fieldSelector=f"spec.driver={driver}",
        )
        self.requests = Informer(kube, path(API_VERSION, "composabilityrequests"), wake)
        self.quarantines = Informer(
            kube,
            path(RESOURCE_API, "devicetaintrules"),
            wake,
            name="quarantines",
            labelSelector=f"{QUARANTINE_LABEL}=scaler",
        )
        # Vendor-driver mode (device_scaler/vendor.py): Fabrics name the vendor drivers,
        # whose slices are watched from the first pass that needs them.
        self.fabrics = Informer(kube, path(API_VERSION, "fabrics"), wake)
        self.vendor_slices: dict[str, Informer] = {}
        self.nodes: Informer | None = None  # started by _labelled
        self._pool_driver: dict[str, str] = {}  # vendor fabric -> its driver (quarantines)
        self._refused_warned: set[tuple[str, str | None]] = set()
        self.informers = [
            self.claims,
            self.resources,
            self.slices,
            self.requests,
            *([self.quarantines] if config.taint_rules else []),
            self.fabrics,
        ]
        self.synced = threading.Event()
        # Warm standby: claim uid -> its arrival, kept for the longest window so that a
        # claim counts after it is gone (device_scaler/standby.py).
        self._arrivals: dict[str, sb.Arrival] = {}
        self._pool = self._executor(8, "scaler-write")
        self._unseen = Unseen(time.monotonic)
        self._sending: set[Future[None]] = set()  # pipelined writes on their way
        self._events = self._executor(1, "scaler-events")
        # Each driver's claims as the decision reads them, kept between passes.
        self._memos: dict[str, Memo] = {}
        self._pending = pool_gauges.PendingClaims()  # before the claims informer starts
        self._slice_devices: dict[str, Derived[SliceDevices]] = {}

    # -- lifecycle ----------------------------------------------------------------------

    def _loop(self) -> None:
        self._debounced_passes(
            self._pass,
            every=lambda: self.config.resync,
            debounce=self.config.debounce,
            on_error=self._failed,
            # A pass costs O(cluster) (10-30 ms of CPU at a thousand nodes) and sends its
            # attach writes without waiting for them: it rests after (informer.rest_after).
            rest=True,
        )

    def _pass(self) -> None:
        self.reconcile()
        if not self.synced.is_set():
            log.info("first pass done")  # caches synced: claims are seen from now on
        self.synced.set()

    def _failed(self, exc: BaseException, retry_in: float) -> None:
        RECONCILE_ERRORS.inc()
        log.error("scaler pass failed", exc_info=exc, retry_in=retry_in)

    # -- one pass ---------------------------------------------------------------------

    def snapshot(self, slices: list[JSON] | None = None, driver: str = "") -> ScalerSnapshot:
        """``slices``: a vendor ``driver``'s (vendor.py); by default our driver's."""
        read = self._slice_devices.setdefault(driver, Derived(slice_devices))
        pool_devices: dict[tuple[str, str], JSON] = {}
        local: dict[tuple[str, str], str] = {}
        for devices in read.map(self.slices.items() if slices is None else slices):
            pool_devices.update(devices.pool)
            local.update(devices.local)
        return ScalerSnapshot(
            now=time.time(),
            claims=self.claims.items(),
            resources=self.resources.items(),
            pool_devices=pool_devices,
            local_devices=local,
            requests=self.requests.items(),
            quarantines=self.quarantines.items(),
        )

    def _memo(self, driver: str) -> Memo:
        return self._memos.setdefault(driver, Memo(driver))

    def reconcile(self) -> int:
        self._unseen.forget_seen(
            lambda name: self.resources.get(name) is not None,
            lambda key: _version(self.claims.get(key)),
        )
        snap = self.snapshot()
        modes = vendor_modes(self.fabrics.items(), self.config.vendor_plugin_namespace)
        self._warn_refused(modes)
        self._pool_driver = {f: m.driver for m in modes for f in m.fabrics}
        # Each resource is decided with its fabric's driver: ours, or a vendor's.
        own = replace(
            snap,
            resources=[r for r in snap.resources if fabric_of(r) not in self._pool_driver],
            standby=self._standby_inputs(snap),
        )
        actions: list[Any] = self._confirm_releases(
            decide(own, self.settings, self._memo(self.settings.driver)), own
        )
        for mode in modes:
            vendor_slices = self._vendor_slice_items(mode.driver)
            if vendor_slices is None:
                continue  # its informer has not listed yet; it wakes us when it has
            vsnap = replace(
                self.snapshot(vendor_slices, mode.driver),
                resources=[r for r in snap.resources if fabric_of(r) in mode.fabrics],
            )
            settings = replace(self.settings, driver=mode.driver)
            actions += self._confirm_releases(
                complete_vendor(decide(vsnap, settings, self._memo(mode.driver)), vsnap, mode),
                vsnap,
                mode.driver,
            )
        actions = hold_back(actions, self._unseen, _claim_of(snap.resources))
        # A claim's resource and its FabricDeviceReady depend on nothing else this pass
        # does: they go out without the pass waiting for them, so the next claim's pass
        # runs meanwhile (``_unseen`` keeps a later pass from sending them again).
        for action in actions:
            if _pipelined(action):
                self._unseen.sent(action)
                sending = self._pool.submit(self._send, action)
                self._sending.add(sending)
                sending.add_done_callback(self._sending.discard)
        actions = [a for a in actions if not _pipelined(a)]
        for action in actions:
            self._unseen.sent(action)
        # decide's order matters between kinds (a device is quarantined before its claim
        # is marked failed, and that before its resource is deleted), not within one: a
        # run of creates or of claim status writes, one per claim, goes out at once.
        for kind, run in itertools.groupby(actions, key=type):
            batch = list(run)
            if kind in _CONCURRENT and len(batch) > 1:
                list(self._pool.map(self._try, batch))
            else:
                for action in batch:
                    self._try(action)
        idle: dict[str, int] = {}
        for cr in snap.resources:
            spec = cr.get("spec") or {}
            if (
                managed(cr)
                and not spec.get("claimRef")
                and (cr.get("status") or {}).get("phase") == "Online"
            ):
                node = spec.get("targetNode", "")
                idle[node] = idle.get(node, 0) + 1
        IDLE_DEVICES.clear()
        for node, n in idle.items():
            IDLE_DEVICES.labels(node).set(n)
        self._standby_metrics(own)
        pool_gauges.publish(snap.resources, snap.quarantines, len(self._pending), snap.now)
        return len(actions)

    def _standby_inputs(self, snap: ScalerSnapshot) -> sb.StandbyInputs:
        """The zones with a standby policy, and the claim arrivals of the longest window."""
        by_fabric = sb.policies(self.fabrics.items())
        if not by_fabric:
            self._arrivals.clear()
            return sb.StandbyInputs()
        zones = sb.zones_of(self.slices.items(), by_fabric, self._labelled)
        fabric_gpus = [
            (node, local)
            for cr in snap.resources
            if (uuid := (cr.get("status") or {}).get("deviceUUID"))
            and (node := (cr.get("spec") or {}).get("targetNode"))
            and (local := snap.local_devices.get((node, normalize_uuid(str(uuid)))))
        ]
        seen = sb.claim_arrivals(snap.claims, self.settings.driver, zones, fabric_gpus, snap.now)
        for uid, arrival in seen.items():
            self._arrivals.setdefault(uid, arrival)
        horizon = max((z.policy.window_seconds for z in zones), default=0)
        self._arrivals = {u: a for u, a in self._arrivals.items() if snap.now - a.at <= horizon}
        return sb.StandbyInputs(zones, tuple(self._arrivals.values()))

    def _standby_metrics(self, snap: ScalerSnapshot) -> None:
        STANDBY_IDLE.clear()
        STANDBY_TARGET.clear()
        held = standby_held(snap.resources)
        for zone in snap.standby.zones:
            arrived = [
                a
                for a in snap.standby.arrivals
                if zone.pool in a.pools and snap.now - a.at <= zone.policy.window_seconds
            ]
            STANDBY_TARGET.labels(zone.pool).set(sb.standby_size(len(arrived), zone.policy))
            STANDBY_IDLE.labels(zone.pool).set(held.get(zone.pool, 0))

    def _warn_refused(self, modes: list[VendorMode]) -> None:
        """Once per driver and namespace: a Fabric's restarts that are not allowed."""
        for mode in modes:
            key = (mode.driver, mode.refused_namespace)
            if mode.refused_namespace is None or key in self._refused_warned:
                continue
            self._refused_warned.add(key)
            log.warning(
                "vendor plugin restarts refused: the scaler may delete pods only in its "
                "--vendor-plugin-namespace",
                driver=mode.driver,
                fabrics=sorted(mode.fabrics),
                namespace=mode.refused_namespace,
                allowed=self.config.vendor_plugin_namespace,
            )

    def _labelled(self, key: str, value: str) -> list[str]:
        """Nodes carrying key=value (a pool selecting its zone by label; standby only):
        the Node informer starts on first need, and names none until it has synced."""
        if self.nodes is None:
            self.nodes = Informer(
                self.kube, path("v1", "nodes"), self._wake.set, name="nodes", keep=node_labels
            )
            self.informers.append(self.nodes)  # stopped with the others
            self.nodes.start()
        if not self.nodes.synced.is_set():
            return []
        return [
            str(n["metadata"]["name"])
            for n in self.nodes.items()
            if (n["metadata"].get("labels") or {}).get(key) == value
        ]

    def _vendor_slice_items(self, driver: str) -> list[JSON] | None:
        informer = self.vendor_slices.get(driver)
        if informer is None:
            informer = Informer(
                self.kube,
                path(RESOURCE_API, "resourceslices"),
                self._wake.set,
                name=f"slices-{driver}",
                fieldSelector=f"spec.driver={driver}",
            )
            self.vendor_slices[driver] = informer
            self.informers.append(informer)  # stopped with the others
            informer.start()
        return informer.items() if informer.synced.is_set() else None

    def _confirm_releases(
        self, actions: list[Any], snap: ScalerSnapshot, driver: str | None = None
    ) -> list[Any]:
        """Drop the releases whose device a consistent read still finds in a pool.

        ``decide`` releases a GPU once the slice cache no longer shows it in its pool; a
        cache can lag (or catch a device between two slices of a rewritten pool), and a
        released GPU is published by its node at once. So the pool publisher's drop is
        checked against the API server itself before the claimRef goes.
        """
        releases = [a for a in actions if isinstance(a, PatchResource) and a.reason == "Released"]
        if not releases:
            return actions
        try:
            listed = self.kube.get(
                path(RESOURCE_API, "resourceslices"),
                fieldSelector=f"spec.driver={driver or self.settings.driver}",
                labelSelector=f"{POOL_MANAGED_LABEL}={POOL_MANAGED_VALUE}",
            )
        except KubeError as exc:
            log.warning("could not confirm releases; trying again", error=str(exc))
            self._wake.set()
            skipped = {id(a) for a in releases}
            return [a for a in actions if id(a) not in skipped]
        in_pools = {
            (str(((sl.get("spec") or {}).get("pool") or {}).get("name", "")), str(d.get("name")))
            for sl in listed.get("items") or []
            for d in (sl.get("spec") or {}).get("devices") or []
        }
        by_name = {cr["metadata"]["name"]: cr for cr in snap.resources}
        held = []
        for a in releases:
            ann = (by_name.get(a.name, {}).get("metadata") or {}).get("annotations") or {}
            if (ann.get(ANN_POOL, ""), ann.get(ANN_POOL_DEVICE, "")) in in_pools:
                held.append(a)
        if held:
            self._wake.set()  # look again: the pool publisher drops it soon
        dropped = {id(a) for a in held}
        return [a for a in actions if id(a) not in dropped]

    def _try(self, action: Any) -> None:
        try:
            self._do(action)
        except KubeError as exc:
            self._unseen.failed(action)
            RECONCILE_ERRORS.inc()
            log.warning("action failed", action=type(action).__name__, error=str(exc))
            self._wake.set()  # look again soon
        except BaseException:
            self._unseen.failed(action)
            raise

    def wait_sent(self, timeout: float) -> None:
        """Until the pipelined writes of the passes so far are done (or ``timeout``)."""
        wait(list(self._sending), timeout)

    def _send(self, action: Any) -> None:
        """A pipelined write, in the write pool: nothing waits for it, so its failure
        is logged here and the next pass decides it again."""
        try:
            self._try(action)
        except Exception:
            RECONCILE_ERRORS.inc()
            log.exception("action failed", action=type(action).__name__)
            self._wake.set()

    def _do(self, action: Any) -> None:
        if isinstance(action, CreateResource):
            ACTIONS.labels("create").inc()
            try:
                self.kube.create(path(API_VERSION, "composableresources"), action.body)
            except Conflict:
                return  # made by an earlier pass or leader
            spec = ComposableResourceSpec.model_validate(action.body["spec"])
            claim = action.claim  # None: a warm standby GPU
            log.info(
                "attach requested" if claim else "standby attach requested",
                claim=f"{claim.namespace}/{claim.name}" if claim else None,
                resource=action.name,
                fabric=spec.fabric,
                device=spec.device_id,
                node=spec.target_node,
            )
            if claim is None:
                return
            self._claim_event(
                claim,
                "Normal",
                "AttachRequested",
                f"ComposableResource {action.name}: attaching {spec.device_id} to "
                f"{spec.target_node}",
                action.device,
            )
        elif isinstance(action, SetDeviceStatus):
            ACTIONS.labels("status").inc()
            self._set_status(action)
        elif isinstance(action, DeleteResource):
            ACTIONS.labels("delete").inc()
            self.kube.delete(path(API_VERSION, "composableresources", action.name))
            log.info(
                "resource deleted", resource=action.name, reason=action.reason, why=action.message
            )
        elif isinstance(action, PatchResource):
            ACTIONS.labels("patch").inc()
            self.kube.merge_patch(
                path(API_VERSION, "composableresources", action.name), action.patch
            )
            log.info(
                "resource updated", resource=action.name, reason=action.reason, why=action.message
            )
            if action.reason == "Released":
                self._resource_event(action.name, action.reason, action.message)
        elif isinstance(action, Quarantine):
            self._quarantine(action)
        elif isinstance(action, RestartVendorPlugin):
            self._restart_vendor_plugin(action)
        elif isinstance(action, Rescheduled):
            log.info("device rescheduled", claim=action.claim.name, device=action.device)
            self._claim_event(
                action.claim,
                "Normal",
                names.FABRIC_DEVICE_RESCHEDULE,
                f"{action.device} is attached; rescheduling onto local device {action.local}",
                action.device,
            )
        elif isinstance(action, Unquarantine):
            ACTIONS.labels("unquarantine").inc()
            self.kube.delete(path(RESOURCE_API, "devicetaintrules", action.rule))

    def _quarantine(self, action: Quarantine) -> None:
        """A NoSchedule DeviceTaintRule on a failed pool device, so the scheduler's retry
        picks another block; nothing where the server serves no such rules."""
        if not self.config.taint_rules:
            log.warning(
                "device not quarantined",
                pool=action.pool,
                device=action.device,
                why="this API server serves no resource.k8s.io/v1 DeviceTaintRules",
            )
            return
        ACTIONS.labels("quarantine").inc()
        fabric = action.pool.split("/", 1)[0]
        body = quarantine_body(action, self._pool_driver.get(fabric, self.settings.driver))
        try:
            self.kube.create(path(RESOURCE_API, "devicetaintrules"), body)
        except Conflict:
            self.kube.merge_patch(
                path(
                    RESOURCE_API,
                    "devicetaintrules",
                    quarantine_rule_name(action.pool, action.device),
                ),
                {"metadata": {"annotations": body["metadata"]["annotations"]}},
            )
        log.info("device quarantined", pool=action.pool, device=action.device)

    def _restart_vendor_plugin(self, action: RestartVendorPlugin) -> None:
        """Delete the vendor plugin's pods on the node: its DaemonSet starts them again,
        and the new process enumerates the GPUs (with the hot-plugged one)."""
        ACTIONS.labels("restart-vendor-plugin").inc()
        pods = self.kube.get(
            path("v1", "pods", namespace=action.namespace),
            labelSelector=action.selector,
            fieldSelector=f"spec.nodeName={action.node}",
        )
        for pod in pods.get("items") or []:
            with contextlib.suppress(NotFound):
                self.kube.delete(
                    path("v1", "pods", pod["metadata"]["name"], namespace=action.namespace)
                )
            log.info("vendor plugin restarted", node=action.node, pod=pod["metadata"]["name"])

    def _set_status(self, action: SetDeviceStatus) -> None:
        c = action.claim
        try:
            apply_devices(
                self.kube,
                action.entries,
                FIELD_MANAGER,
                namespace=c.namespace,
                name=c.name,
                uid=c.uid,
            )
        except NotFound:
            return
        for device, since in action.ready:
            if since is not None:
                TIME_TO_GPU.observe(max(0.0, since))
            log.info("device ready", claim=f"{c.namespace}/{c.name}", device=device, phase="Online")
            self._claim_event(
                c, "Normal", names.FABRIC_DEVICE_READY, f"{device} is attached and visible", device
            )
        for device, reason, message in action.failed:
            ATTACH_FAILURES.labels(reason).inc()
            log.warning(
                "device failed",
                claim=f"{c.namespace}/{c.name}",
                device=device,
                reason=reason,
                error=message,
            )
            self._claim_event(
                c, "Warning", names.FABRIC_DEVICE_FAILED, f"{device}: {reason}: {message}", device
            )

    # -- events -------------------------------------------------------------------------

    def _claim_seen(self, kind: str, claim: JSON) -> None:
        """Counts the claims with no allocation; a Warning Event, once, on a claim that
        arrived cut (composable_dra/k8s/kube_json.py): the suite serves it without the
        cut parts, and refuses our driver's config there."""
        self._pending.event(kind, claim)
        if kind == "DELETED":
            return
        cut = kube_json.cut_paths(claim, limit=3)
        meta = claim.get("metadata") or {}
        if not cut or not meta.get("uid") or not meta.get("namespace") or not meta.get("name"):
            return
        self._claim_event(
            ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
            "Warning",
            names.NESTED_TOO_DEEP,
            f"parts nested deeper than {kube_json.MAX_DEPTH} levels are not read: "
            f"{', '.join(cut)}; a config for {self.settings.driver} there is refused",
            "",
        )

    def _claim_event(
        self, claim: ClaimRef, kind: str, reason: str, message: str, device: str
    ) -> None:
        key = (claim.uid, reason, device)
        with self._events_lock:  # actions run on several threads
            if key in self._events_sent:
                return
            self._events_sent.add(key)
            if len(self._events_sent) > 10000:
                self._events_sent.clear()
        involved = claim_object(claim.name, claim.namespace, claim.uid)
        self._event(involved, claim.namespace, kind, reason, message)

    def _resource_event(self, name: str, reason: str, message: str) -> None:
        cr = self.resources.get(name)
        if cr is None:
            return
        self._event(
            {
                "kind": "ComposableResource",
                "apiVersion": API_VERSION,
                "name": name,
                "uid": cr["metadata"].get("uid", ""),
            },
            "default",
            "Normal",
            reason,
            message,
        )

    def _event(self, involved: JSON, namespace: str, kind: str, reason: str, message: str) -> None:
        body = event_body(involved, namespace, kind, reason, message, COMPONENT)
        # Events are for people: posted off the path that attaches devices.
        self._events.submit(self._post_event, namespace, body)

    def _post_event(self, namespace: str, body: JSON) -> None:
        with contextlib.suppress(KubeError):
            self.kube.create(path("v1", "events", namespace=namespace), body)
