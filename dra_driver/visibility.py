"""The plugin's side of fabric attachment: ComposableResources that target this node.

Two jobs, both driven by a watch on the resources whose ``spec.targetNode`` is this node:
- Visibility: once the operator has attached a device and written its UUID to
  ``status.deviceUUID``, run the host-side step (a configurable command such as a PCI
  rescan, then a fresh read of the device source), look for that UUID among the node's
  devices, and report the answer as the ``DeviceVisible`` condition (server-side apply
  with this plugin's own field manager, so the operator's conditions stay its own).
- Publishing once: a device whose resource has a ``claimRef`` and is Attaching or Online
  serves an allocation made through the fabric pool; it keeps that identity, so it is
  left out of the node's local slice. Without a claimRef an attached GPU is an idle local
  device and is published as one.
"""

from __future__ import annotations

import datetime
import shlex
import subprocess
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from api.v1alpha1 import API_VERSION
from composable_dra import logs, names
from composable_dra.kube import JSON, Gone, Kube, KubeError, NotFound, path
from composable_dra.names import normalize_uuid
from dra_driver.device_source import DeviceInfo

PLURAL = "composableresources"
_SERVING_PHASES = ("Attaching", "Online")


def serving_uuids(resources: Iterable[JSON]) -> set[str]:
    """UUIDs of the devices that serve a pool allocation on this node."""
    out = set()
    for r in resources:
        status = r.get("status") or {}
        if (
            r.get("spec", {}).get("claimRef")
            and status.get("phase") in _SERVING_PHASES
            and status.get("deviceUUID")
        ):
            out.add(normalize_uuid(status["deviceUUID"]))
    return out


def local_devices(devices: Sequence[DeviceInfo], serving: set[str]) -> list[DeviceInfo]:
    return [d for d in devices if normalize_uuid(d.uuid) not in serving]


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
        self._serving: set[str] = set()
        self._published = False
        # Set once the resources of this node are known (or there are none to know: no
        # CRD). Until then nothing is published: a restarted plugin must not offer a GPU
        # that serves a pool allocation as a free local device, even for a moment.
        self.synced = threading.Event()
        self._log = logs.get(__name__, node=node)
        self.manager = "composable-dra-plugin"

    def local_devices(self, devices: Sequence[DeviceInfo]) -> list[DeviceInfo] | None:
        """What the node's slices may publish; None until the resources are known."""
        if not self.synced.is_set():
            return None
        with self._lock:
            return local_devices(devices, self._serving)

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
                        self._serving = serving_uuids(self._resources.values())
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
        serving = serving_uuids(resources)
        with self._lock:
            changed = serving != self._serving or not self._published
            self._serving = serving
            self._published = True
        if changed:
            self._publish(local_devices(self._devices(), serving))
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
