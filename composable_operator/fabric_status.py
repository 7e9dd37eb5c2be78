"""Fabric status and orphan handling, as pure functions plus a kopf daemon per Fabric.

Each pass reads the fabric once and:
- leaves the inventory for the rest of the operator (inventories.py): an Online
  resource's check and an attach step's host mapping read it instead of the fabric;
- reports it in the Fabric's status (one server-side apply): reachable, free devices by
  model and zone, last sync;
- finds orphans: devices attached to the host of one of our nodes with no
  ComposableResource saying so. One that stays an orphan longer than the grace period is,
  per the Fabric's orphanPolicy, adopted (the default) or detached. Adopting creates a
  ComposableResource annotated composable.dra.io/adopted=adopt, with no claimRef: the
  node's plugin publishes the GPU as a local device, and the scaler's idle rule (the one
  owner of that rule, device_scaler.decide.managed) detaches it once idle, as it does any
  GPU it attached itself. Detaching adopts it and deletes that resource at once: the
  detach then goes through the same taint, allocation check and fabric call as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import kopf

from api.v1alpha1 import API_VERSION, GROUP, VERSION, FabricSpec
from composable_dra.fabric.backend import Inventory
from composable_dra.fabric.errors import FabricError
from composable_dra.fabric.registry import FabricConfigError, Fabrics
from composable_dra.k8s.kube import JSON, Conflict, Kube, path
from composable_dra.k8s.timestamps import now_rfc3339
from composable_dra.model import names
from composable_dra.process import logs
from composable_operator import metrics
from composable_operator.cluster_cache import Nodes, node_per_host
from composable_operator.inventories import Inventories

log = logs.get(__name__)
ADOPTED = names.ANN_ADOPTED


def free_devices(inv: Inventory) -> list[JSON]:
    counts = Counter((d.model, d.zone) for d in inv.devices.values() if d.state == "free")
    for (zone, model), n in inv.free_counts.items():  # a fabric that counts its free GPUs
        counts[(model, zone)] += n
    return [{"model": m, "zone": z, "count": n} for (m, z), n in sorted(counts.items())]


@dataclass(frozen=True)
class Orphan:
    device: str
    host: str
    node: str
    model: str


def find_orphans(
    inv: Inventory,
    host_nodes: dict[str, str],
    claimed_devices: set[str],
    first_seen: dict[str, float],
    now: float,
    grace: float,
) -> tuple[list[Orphan], dict[str, float]]:
    """Orphans past the grace period, and the first-seen times to keep for the next pass.

    host_nodes maps fabric hosts to our nodes; claimed_devices are the device ids that
    some ComposableResource of this fabric names.
    """
    seen: dict[str, float] = {}
    due = []
    for d in inv.devices.values():
        if d.state != "attached" or d.host not in host_nodes or d.id in claimed_devices:
            continue
        seen[d.id] = first_seen.get(d.id, now)
        if now - seen[d.id] >= grace:
            due.append(Orphan(d.id, d.host, host_nodes[d.host], d.model))
    return due, seen


@dataclass(eq=False)  # one per operator, compared by identity: it holds what each pass wrote
class FabricWatch:
    """One pass per poll interval over one Fabric; see the module docstring.

    ``nodes``: the operator's Node cache (none: each pass lists Nodes); ``inventories``:
    where each pass leaves its inventory. The devices that resources name come from
    kopf's index of them when the daemon has it (``claimed``; else a list per pass)."""

    kube: Kube
    fabrics: Fabrics
    nodes: Nodes | None = None
    inventories: Inventories | None = None
    # The last status fields written per Fabric: an unreachable pass keeps them.
    written: dict[str, JSON] = field(default_factory=dict)

    def host_nodes(self, spec: FabricSpec, inv: Inventory) -> dict[str, str]:
        """fabric host -> our node on it, from the Node cache (no list per pass)."""
        return node_per_host(self.nodes, self.kube, spec, inv.hosts)

    def claimed(self, fabric: str, index_keys: Iterable[tuple[str, str]] | None = None) -> set[str]:
        if index_keys is not None:
            return {device for fab, device in index_keys if fab == fabric}
        items = self.kube.get(
            path(API_VERSION, "composableresources"), fieldSelector=f"spec.fabric={fabric}"
        )["items"]
        # On a fabric that picks, a resource's device is the one recorded in its status.
        picked = {str(p) for r in items if (p := (r.get("status") or {}).get("fabricDeviceID"))}
        return {r["spec"]["deviceID"] for r in items} | picked

    def adopt(self, fabric: str, orphan: Orphan, detach: bool) -> None:
        name = f"orphan-{fabric}-{orphan.device}".lower()[:253]
        body = {
            "apiVersion": API_VERSION,
            "kind": "ComposableResource",
            # The finalizer from the start: the device is attached already, and a resource
            # deleted at once (policy Detach) must still go through the detach.
            "metadata": {
                "name": name,
                "annotations": {ADOPTED: "detach" if detach else "adopt"},
                "labels": {names.LABEL_FABRIC: fabric},
                "finalizers": [names.FINALIZER],
            },
            "spec": {
                "fabric": fabric,
                "deviceID": orphan.device,
                "targetNode": orphan.node,
                "model": orphan.model,
            },
        }
        with contextlib.suppress(Conflict):  # adopted on an earlier pass
            self.kube.create(path(API_VERSION, "composableresources"), body)
        if detach:
            self.kube.delete(path(API_VERSION, "composableresources", name))

    def write_status(
        self, name: str, fields: JSON, reachable: bool, reason: str, message: str
    ) -> None:
        """One server-side apply of the whole status this operator owns: fields it leaves
        out it would drop, so a pass that only knows ``reachable`` keeps the last ones."""
        status = {**self.written.get(name, {}), **fields}
        self.written[name] = status
        self.kube.apply(
            path(API_VERSION, "fabrics", name, subresource="status"),
            {
                "apiVersion": API_VERSION,
                "kind": "Fabric",
                "metadata": {"name": name},
                "status": {
                    **status,
                    "conditions": [
                        {
                            "type": "Reachable",
                            "status": "True" if reachable else "False",
                            "reason": reason,
                            "message": message[:1000],
                            "lastTransitionTime": now_rfc3339(),
                        }
                    ],
                },
            },
            "composable-operator",
        )


STATUS_FIELDS = ("reachable", "freeDevices", "lastSyncTime")


async def report(watch: FabricWatch, name: str, inv: Inventory) -> None:
    """A pass's inventory in the Fabric's status (free devices, last sync) and metrics."""
    free = free_devices(inv)
    by_model: Counter[str] = Counter()
    for entry in free:
        by_model[entry["model"]] += entry["count"]
    # Every model the fabric has, 0 where none is free: a model whose last free device
    # went must read 0, not the count it had (what a "pool exhausted" alert looks for).
    models = {d.model for d in inv.devices.values()} | {m for _, m in inv.free_counts}
    for model in models | set(by_model):
        metrics.POOL_FREE.labels(name, model).set(by_model.get(model, 0))
    metrics.FABRIC_REACHABLE.labels(name).set(1)
    await asyncio.to_thread(
        watch.write_status,
        name,
        {"reachable": True, "freeDevices": free, "lastSyncTime": now_rfc3339()},
        True,
        "Synced",
        f"{len(inv.devices)} devices, {sum(by_model.values())} free",
    )


async def handle_orphans(
    watch: FabricWatch,
    name: str,
    spec: FabricSpec,
    inv: Inventory,
    body: kopf.Body,
    by_device: Any,
    first_seen: dict[str, float],
) -> dict[str, float]:
    """Adopt or detach the orphans past their grace period (find_orphans); the first-seen
    times to keep for the next pass. ``by_device``: kopf's index, None in a test."""
    host_nodes = await asyncio.to_thread(watch.host_nodes, spec, inv)
    if by_device is not None:
        # Read here: kopf changes its index on this loop.
        claimed = watch.claimed(name, list(by_device.keys()))
    else:
        claimed = await asyncio.to_thread(watch.claimed, name)
    due, first_seen = find_orphans(
        inv,
        host_nodes,
        claimed,
        first_seen,
        time.monotonic(),
        float(spec.orphan_grace_period_seconds),
    )
    for orphan in due:
        detach = spec.orphan_policy == "Detach"
        await asyncio.to_thread(watch.adopt, name, orphan, detach)
        verb = "detaching" if detach else "adopted"
        kopf.warn(
            body,
            reason="OrphanDevice",
            message=f"{orphan.device} on {orphan.node} had no ComposableResource; {verb} it",
        )
        log.warning(
            "orphan device",
            fabric=name,
            device=orphan.device,
            node=orphan.node,
            policy=spec.orphan_policy,
        )
        first_seen.pop(orphan.device, None)
    return first_seen


async def report_unreachable(
    watch: FabricWatch, name: str, exc: FabricError | FabricConfigError
) -> None:
    """A pass that could not read the fabric: counted, and the Fabric's status says so."""
    if isinstance(exc, FabricError):
        metrics.FABRIC_ERRORS.labels(name, exc.kind).inc()
    metrics.FABRIC_REACHABLE.labels(name).set(0)
    log.warning("fabric unreachable", fabric=name, error=str(exc))
    try:
        await asyncio.to_thread(
            watch.write_status, name, {"reachable": False}, False, type(exc).__name__, str(exc)
        )
    except Exception:
        log.exception("could not write Fabric status", fabric=name)


# The Fabric daemon's one loop (read, publish, report, orphans) as kopf wants it, a
# closure; what it decides lives in FabricWatch and the functions above.
def register(registry: kopf.OperatorRegistry, watch: FabricWatch) -> None:
    @kopf.daemon(GROUP, VERSION, "fabrics", registry=registry, cancellation_timeout=10)
    async def poll(name: str, body: kopf.Body, stopped: kopf.DaemonStopped, **kwargs: Any) -> None:
        first_seen: dict[str, float] = {}
        flog = log.bind(fabric=name)
        # Kept across a restart: what an unreachable first pass does not know.
        watch.written.setdefault(
            name, {k: body.status[k] for k in STATUS_FIELDS if k in body.status}
        )
        # kopf passes each index by its handler's name (handlers.py); none in a test.
        by_device = kwargs.get("resources_by_device")
        while not stopped:
            interval = 30.0
            try:
                spec, backend = await asyncio.to_thread(watch.fabrics.get, name)
                interval = float(spec.poll_interval_seconds)
                read_at = time.monotonic()
                inv = await asyncio.to_thread(backend.inventory)
                if watch.inventories is not None:
                    watch.inventories.publish(name, inv, read_at, interval)
                await report(watch, name, inv)
                if spec.orphan_policy != "Ignore":
                    first_seen = await handle_orphans(
                        watch, name, spec, inv, body, by_device, first_seen
                    )
            except (FabricError, FabricConfigError) as exc:
                await report_unreachable(watch, name, exc)
                interval = min(interval, 10.0)
            except Exception:
                metrics.RECONCILE_ERRORS.labels("fabric").inc()
                flog.exception("fabric pass failed")
            await stopped.wait(interval)
