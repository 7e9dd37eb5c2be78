"""The plugin's side of fabric attachment: ComposableResources that target this node.

Two jobs, both driven by a watch on the resources whose ``spec.targetNode`` is this node:
- Visibility: once the operator has attached a device and written its UUID to
  ``status.deviceUUID``, run the host-side step (a configurable command such as a PCI
  rescan, then a fresh read of the device source), look for that UUID among the node's
  devices, and report the answer as the ``DeviceVisible`` condition (server-side apply
  with this plugin's own field manager, so the operator's conditions stay its own).
- Publishing once: a device whose resource has a ``claimRef`` serves (or is about to
  serve) an allocation made through the fabric pool; it keeps that identity, so it is left
  out of the node's local slice. Without a claimRef an attached GPU is an idle local device
  and is published as one.

The fabric shows a GPU on the node before the operator has written its UUID to the
resource, so "no resource names this UUID" does not make a GPU local: while a resource
with a claimRef and no UUID yet targets the node, GPUs not already published stay out
(``publishable``). And a GPU is added to the local slice only after a consistent read of the
node's resources (not the watch cache) agrees: the scaler creates the resource before the
operator can attach anything, so that read always sees it (docs/attach-flow.md, Publishing
each GPU once).
"""

from __future__ import annotations

import datetime
import shlex
import subprocess
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from api.v1alpha1 import API_VERSION
from composable_dra import logs, names
from composable_dra.kube import JSON, Gone, Kube, KubeError, NotFound, path
from composable_dra.names import normalize_uuid
from dra_driver.device_source import DeviceInfo

PLURAL = "composableresources"


@dataclass(frozen=True)
class Reservations:
    """What the node's ComposableResources say about its GPUs."""

    serving: frozenset[str]  # UUIDs that serve (or are about to serve) a pool allocation
    released: frozenset[str]  # UUIDs of released GPUs: idle, free for local use
    pending: bool  # a pool attach whose GPU is not identified yet (no deviceUUID)


def reservations(resources: Iterable[JSON]) -> Reservations:
    serving, released, pending = set(), set(), False
    for r in resources:
        status = r.get("status") or {}
        if status.get("phase") == "Detached":
            continue
        uuid = normalize_uuid(str(status.get("deviceUUID") or ""))
        if (r.get("spec") or {}).get("claimRef"):
            # Any phase: a Failed attach may have attached the GPU all the same, and it
            # stays the pool allocation's until the resource is gone.
            if uuid:
                serving.add(uuid)
            else:
                pending = True
        elif uuid and status.get("phase") == "Online":
            released.add(uuid)
    return Reservations(frozenset(serving), frozenset(released), pending)


def named_uuids(resources: Iterable[JSON]) -> frozenset[str]:
    """The GPUs the node's resources name, in any phase: the fabric's, never lent."""
    return frozenset(
        normalize_uuid(str(u))
        for r in resources
        if (u := (r.get("status") or {}).get("deviceUUID"))
    )


def publishable(
    devices: Sequence[DeviceInfo], res: Reservations, published: Collection[str]
) -> list[DeviceInfo]:
    """The devices the node's local slice may show.

    Never one that serves a pool allocation. While a pool attach on this node is not
    identified yet, no device joins the slice unless it is known: already published, or a
    released GPU (its resource names it); the unknown one may be that attach's GPU.
    """
    out = []
    for d in devices:
        uuid = normalize_uuid(d.uuid)
        if uuid in res.serving:
            continue
        if res.pending and uuid not in published and uuid not in res.released:
            continue
        out.append(d)
    return out


def visibility_updates(resources: Iterable[JSON], present: set[str]) -> dict[str, bool]:
    """Resource name -> the DeviceVisible value to write, where it differs from the status."""
    updates = {}
    for r in resources:
        status = r.get("status") or {}
        uuid = status.get("deviceUUID")
        if not uuid or status.get("phase") in ("Detached", "Failed"):
            continue
        visible = normalize_uuid(uuid) in present
        current = next(
            (
                c.get("status")
                for c in status.get("conditions", []) or []
                if c.get("type") == names.DEVICE_VISIBLE
            ),
            None,
        )
        if current != ("True" if visible else "False"):
            updates[r["metadata"]["name"]] = visible
    return updates


def awaiting(resources: Iterable[JSON], present: set[str]) -> list[str]:
    """Resources attached by the fabric whose device this node does not show yet."""
    return [
        r["metadata"]["name"]
        for r in resources
        if (r.get("status") or {}).get("phase") == "Attaching"
        and (r.get("status") or {}).get("deviceUUID")
        and normalize_uuid(r["status"]["deviceUUID"]) not in present
    ]


class AttachmentWatcher:
    """Watches this node's ComposableResources; see the module docstring."""

    def __init__(
        self,
        kube: Kube,
        node: str,
        devices: Callable[[], list[DeviceInfo]],
        refresh: Callable[[], object],
        publish: Callable[[list[DeviceInfo]], None],
        host_step: str | None = None,
        retry_interval: float = 0.5,
    ) -> None:
        self.kube, self.node = kube, node
        self._devices, self._refresh, self._publish = devices, refresh, publish
        self._host_step = shlex.split(host_step) if host_step else None
        self._retry = retry_interval
        self._resources: dict[str, JSON] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # The last list handed to ``publish`` (None: none yet). A decision and its hand-over
        # happen under one lock, so an older decision never overwrites a newer one.
        self._last: list[DeviceInfo] | None = None
        self._publish_lock = threading.Lock()
        # UUIDs of the GPUs the node's resources name (named_uuids): the fabric's, never
        # lent. Set with each hand-over to ``publish``.
        self.fabric_uuids: frozenset[str] = frozenset()
        # Set once the resources of this node are known (or there are none to know: no
        # CRD). Until then nothing is published: a restarted plugin must not offer a GPU
        # that serves a pool allocation as a free local device, even for a moment.
        self.synced = threading.Event()
        self._log = logs.get(__name__, node=node)
        self.manager = "composable-dra-plugin"

    def republish(self) -> None:
        """Hand the node's slices the devices they may show now, if that changed.

        Nothing until the resources are known. A device joins the slice only when a
        consistent read of the node's resources agrees with the watch cache: a resource
        the cache has not seen yet may be the one this GPU was just attached for.
        """
        if not self.synced.is_set():
            return
        with self._publish_lock:
            devices = self._devices()
            with self._lock:
                cached = list(self._resources.values())
            published = {normalize_uuid(d.uuid) for d in self._last or []}
            source = cached
            out = publishable(devices, reservations(cached), published)
            if {normalize_uuid(d.uuid) for d in out} - published:
                fresh = self._read_resources()
                if fresh is None and self._last is None:
                    return  # not known yet: publish nothing rather than an empty slice
                if fresh is None:  # unknown: the slice may shrink, not grow
                    out = [d for d in out if normalize_uuid(d.uuid) in published]
                else:
                    source = fresh
                    out = publishable(devices, reservations(fresh), published)
            fabric = named_uuids(source)
            # A change of what may be lent matters only for GPUs the slices show.
            lending_changed = (fabric ^ self.fabric_uuids) & {normalize_uuid(d.uuid) for d in out}
            self.fabric_uuids = fabric
            if out != self._last or lending_changed:
                self._last = out
                self._publish(out)

    def _read_resources(self) -> list[JSON] | None:
        """The node's resources as the API server has them now (a quorum list); None when
        that cannot be read."""
        try:
            listed = self.kube.get(
                path(API_VERSION, PLURAL), fieldSelector=f"spec.targetNode={self.node}"
            )
        except NotFound:
            return []  # no CRD: nothing serves a pool allocation
        except Exception as exc:
            self._log.warning("could not read the node's resources", error=str(exc))
            return None
        items: list[JSON] = listed.get("items") or []
        return items

    def start(self) -> None:
        for target, name in (
            (self._watch_loop, "resources-watch"),
            (self._work_loop, "visibility"),
        ):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # -- watch ---------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        url = path(API_VERSION, PLURAL)
        selector = f"spec.targetNode={self.node}"
        rv = ""
        backoff = 1.0
        while not self._stop.is_set():
            try:
                if not rv:
                    listed = self.kube.get(url, fieldSelector=selector)
                    with self._lock:
                        self._resources = {r["metadata"]["name"]: r for r in listed["items"]}
                    rv = listed["metadata"]["resourceVersion"]
                    self.synced.set()
                    self._wake.set()
                for event in self.kube.watch(url, rv, 60, fieldSelector=selector):
                    obj = event["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    with self._lock:
                        if event["type"] == "DELETED":
                            self._resources.pop(obj["metadata"]["name"], None)
                        else:
                            self._resources[obj["metadata"]["name"]] = obj
                    self._wake.set()
                    if self._stop.is_set():
                        return
                backoff = 1.0
            except Gone:
                rv = ""
            except NotFound:
                # No CRD: the plugin runs without a fabric, and nothing serves a pool.
                if not self.synced.is_set():
                    self.synced.set()
                    self._wake.set()
                rv = ""
                self._stop.wait(backoff)
                backoff = min(30.0, backoff * 2)
            except Exception as exc:
                self._log.info("ComposableResource watch unavailable; retrying", error=str(exc))
                rv = ""
                self._stop.wait(backoff)
                backoff = min(30.0, backoff * 2)

    # -- work ----------------------------------------------------------------------------

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=self._retry if self._pending() else 30)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.sync()
            except Exception:
                self._log.exception("visibility pass failed")

    def _pending(self) -> bool:
        with self._lock:
            resources = list(self._resources.values())
        return bool(awaiting(resources, self._present()))

    def _present(self) -> set[str]:
        return {normalize_uuid(d.uuid) for d in self._devices()}

    def sync(self) -> None:
        with self._lock:
            resources = list(self._resources.values())
        if not self.synced.is_set():
            return
        self.republish()
        present = self._present()
        if awaiting(resources, present):
            # The fabric attached a device the node does not show yet: host-side step,
            # then read the device source again.
            self._run_host_step()
            self._refresh()
            present = self._present()
        for name, visible in visibility_updates(resources, present).items():
            self._write(name, visible)

    def _run_host_step(self) -> None:
        if not self._host_step:
            return
        try:
            subprocess.run(self._host_step, check=True, timeout=30, capture_output=True)
        except (OSError, subprocess.SubprocessError) as exc:
            self._log.warning("host-side step failed", command=self._host_step, error=str(exc))

    def _write(self, name: str, visible: bool) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition: dict[str, Any] = {
            "type": names.DEVICE_VISIBLE,
            "status": "True" if visible else "False",
            "reason": "FoundOnNode" if visible else "NotFoundOnNode",
            "message": f"the device {'is' if visible else 'is not'} among node {self.node}'s GPUs",
            "lastTransitionTime": stamp,
        }
        try:
            self.kube.apply(
                path(API_VERSION, PLURAL, name, subresource="status"),
                {
                    "apiVersion": API_VERSION,
                    "kind": "ComposableResource",
                    "metadata": {"name": name},
                    "status": {"conditions": [condition]},
                },
                self.manager,
            )
            self._log.info("device visibility", resource=name, visible=visible)
        except KubeError as exc:
            self._log.warning("could not write DeviceVisible", resource=name, error=str(exc))
