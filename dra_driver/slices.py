"""The node's ResourceSlices: what they should be (pure) and a publisher that makes it so.

One pool named after the node, at most 128 devices a slice, every slice of the pool at
the same ``generation`` with the right ``resourceSliceCount``. The comparison of desired
and observed slices looks only at the fields we set, with quantities compared by value,
so fields the server adds, drops or reformats never start an update loop.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from composable_dra import logs
from composable_dra.kube import Gone, Kube, path
from dra_driver import metrics
from dra_driver.device_source import DeviceInfo
from dra_driver.quantity import format_bytes, parse_bytes

RESOURCE_API = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
FIELD_MANAGER = "composable-dra-plugin"
MANAGED_LABEL = "composable.dra.io/managed-by"
MANAGED_VALUE = "kubelet-plugin"


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
) -> list[dict[str, Any]]:
    """The full set of slices for the node's pool at ``generation``.

    No devices still gives one (empty) slice, so the pool and its generation stay visible.
    """
    ordered = sorted(devices, key=lambda d: d.name)
    chunks = [ordered[i : i + max_per_slice] for i in range(0, len(ordered), max_per_slice)] or [[]]
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node_name, driver, i),
                "labels": {MANAGED_LABEL: MANAGED_VALUE},
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
                "nodeName": node_name,
                "pool": {
                    "name": node_name,
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                "devices": [device_entry(d) for d in chunk],
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def _norm_devices(devices: Any) -> list[tuple[str, str, str]]:
    out = []
    for dev in devices or []:
        capacity = {
            k: parse_bytes(str((v or {}).get("value", "0")))
            for k, v in (dev.get("capacity") or {}).items()
        }
        out.append(
            (
                str(dev.get("name")),
                json.dumps(dev.get("attributes") or {}, sort_keys=True),
                json.dumps(capacity, sort_keys=True),
            )
        )
    return out


def _norm_slice(obj: dict[str, Any]) -> tuple[Any, ...]:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    pool = spec.get("pool") or {}
    owners = sorted(
        (o.get("kind"), o.get("name"), o.get("uid")) for o in meta.get("ownerReferences") or []
    )
    return (
        (meta.get("labels") or {}).get(MANAGED_LABEL),
        owners,
        spec.get("driver"),
        spec.get("nodeName"),
        pool.get("name"),
        pool.get("generation"),
        pool.get("resourceSliceCount"),
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
    at_current = desired_slices(node_name, node_uid, driver, devices, current)
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
        apply=desired_slices(node_name, node_uid, driver, devices, generation),
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
    ) -> None:
        self._kube = kube
        self.node_name, self.node_uid, self.driver = node_name, node_uid, driver
        self._selector = f"spec.nodeName={node_name},spec.driver={driver}"
        self._resync = resync_seconds
        self._devices: list[DeviceInfo] | None = None
        self._generation = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._log = logs.get(__name__, node=node_name)
        self.synced = threading.Event()

    def set_devices(self, devices: Sequence[DeviceInfo]) -> None:
        self._devices = list(devices)
        self._wake.set()

    def start(self) -> None:
        for target, name in ((self._reconcile_loop, "slices"), (self._watch_loop, "slices-watch")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        # The watch thread ends at its next event or timeout; it is a daemon thread.
        if self._threads:
            self._threads[0].join(timeout=5)

    # -- reconcile ---------------------------------------------------------------------

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        body = self._kube.get(path(RESOURCE_API, "resourceslices"), fieldSelector=self._selector)
        return list(body.get("items") or []), str(body["metadata"].get("resourceVersion", ""))

    def reconcile(self) -> SlicePlan | None:
        """One pass; None until the device source has reported once."""
        if self._devices is None:
            return None
        devices = self._devices
        observed, _ = self._list()
        plan = plan_slices(
            self.node_name, self.node_uid, self.driver, devices, observed, self._generation
        )
        for obj in plan.apply:
            self._kube.apply(
                path(RESOURCE_API, "resourceslices", obj["metadata"]["name"]), obj, FIELD_MANAGER
            )
        for name in plan.delete:
            self._kube.delete(path(RESOURCE_API, "resourceslices", name))
        self._generation = plan.generation
        metrics.DEVICES_PUBLISHED.set(len(devices))
        if not plan.empty:
            self._log.info(
                "slices published",
                generation=plan.generation,
                slices=len(plan.apply),
                deleted=plan.delete,
                devices=len(devices),
            )
        return plan

    def _reconcile_loop(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            self._wake.wait(self._resync)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                if self.reconcile() is not None and not self.synced.is_set():
                    self.synced.set()
                    self._log.info("slices in sync", generation=self._generation)
                backoff = 0.2
            except Exception as exc:
                metrics.RECONCILE_ERRORS.inc()
                self._log.warning("publishing slices failed", error=str(exc), retry_in=backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                self._wake.set()

    # -- watch -------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 or an ended watch."""
        while not self._stop.is_set():
            try:
                _, rv = self._list()
                for event in self._kube.watch(
                    path(RESOURCE_API, "resourceslices"),
                    rv,
                    timeout_seconds=300,
                    fieldSelector=self._selector,
                ):
                    if self._stop.is_set():
                        return
                    if event.get("type") in {"ADDED", "MODIFIED", "DELETED"}:
                        self._wake.set()
            except Gone:
                pass
            except Exception as exc:
                if self._stop.is_set():
                    return
                self._log.warning("slice watch failed", error=str(exc))
                self._stop.wait(1.0)
            # After a relist the reconciler looks again too: events may have been missed.
            self._wake.set()
