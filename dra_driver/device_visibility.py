"""DeviceVisible: does a GPU the fabric attached to this node show on it?

Once the operator has attached a device and written its UUID to ``status.deviceUUID``,
run the host-side step (a configurable command such as a PCI rescan, then a fresh read of
the device source), look for that UUID among the node's devices, and report the answer as
the ``DeviceVisible`` condition (server-side apply with this plugin's own field manager, so
the operator's conditions stay its own).

Each pass also has the node's local slice brought up to date (``republish``,
``dra_driver.publish_once``): a GPU that appears or a resource that changes can change
what the slice may show.
"""

from __future__ import annotations

import shlex
import subprocess
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.conditions import condition, find
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from composable_dra.process import logs
from dra_driver.device_source import DeviceInfo
from dra_driver.host_release import HostReleaser
from dra_driver.publish_once import PLURAL

# DeviceVisible writes in flight at once: a fabric that attaches several GPUs to the node
# together has each reported without waiting for the others' writes (docs/attach-flow.md).
WRITERS = 8


def visibility_updates(resources: Iterable[JSON], present: set[str]) -> dict[str, bool]:
    """Resource name -> the DeviceVisible value to write, where it differs from the status."""
    updates = {}
    for r in resources:
        status = r.get("status") or {}
        uuid = status.get("deviceUUID")
        if not uuid or status.get("phase") in ("Detached", "Failed"):
            continue
        visible = normalize_uuid(uuid) in present
        current = find(status.get("conditions"), names.DEVICE_VISIBLE) or {}
        if current.get("status") != ("True" if visible else "False"):
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


class VisibilityReporter:
    """Writes DeviceVisible for the node's resources; see the module docstring.

    ``wake`` is set by the resources' informer on every change.
    """

    def __init__(
        self,
        kube: Kube,
        node: str,
        resources: Informer,
        wake: threading.Event,
        devices: Callable[[], list[DeviceInfo]],
        refresh: Callable[[], object],
        republish: Callable[[], None],
        host_step: str | None = None,
        retry_interval: float = 0.5,
        releaser: HostReleaser | None = None,
    ) -> None:
        self.kube, self.node = kube, node
        self.resources, self._wake = resources, wake
        self._devices, self._refresh, self._republish = devices, refresh, republish
        self._host_step = shlex.split(host_step) if host_step else None
        self._retry = retry_interval
        # Answers the operator's release requests on the same watch and wake-ups.
        self._releaser = releaser
        self._stop = threading.Event()
        self._log = logs.get(__name__, node=node)
        self.manager = "composable-dra-plugin"
        self._writers = ThreadPoolExecutor(WRITERS, thread_name_prefix="visibility-write")

    def start(self) -> None:
        self.resources.start()
        threading.Thread(target=self._work_loop, name="visibility", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.resources.stop()
        self._writers.shutdown(wait=False, cancel_futures=True)

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
        items = self.resources.items()
        if self._releaser is not None and self._releaser.pending(items):
            return True
        return bool(awaiting(items, self._present()))

    def _present(self) -> set[str]:
        return {normalize_uuid(d.uuid) for d in self._devices()}

    def sync(self) -> None:
        resources = self.resources.items()
        if not self.resources.synced.is_set():
            return
        self._republish()
        present = self._present()
        if awaiting(resources, present):
            # The fabric attached a device the node does not show yet: host-side step,
            # then read the device source again.
            self._run_host_step()
            self._refresh()
            present = self._present()
        updates = visibility_updates(resources, present)
        list(self._writers.map(lambda update: self._write(*update), updates.items()))
        if self._releaser is not None:
            self._releaser.sync(resources)

    def _run_host_step(self) -> None:
        if not self._host_step:
            return
        try:
            subprocess.run(self._host_step, check=True, timeout=30, capture_output=True)
        except (OSError, subprocess.SubprocessError) as exc:
            self._log.warning("host-side step failed", command=self._host_step, error=str(exc))

    def _write(self, name: str, visible: bool) -> None:
        written = condition(
            names.DEVICE_VISIBLE,
            visible,
            "FoundOnNode" if visible else "NotFoundOnNode",
            f"the device {'is' if visible else 'is not'} among node {self.node}'s GPUs",
        )
        try:
            self.kube.apply(
                path(API_VERSION, PLURAL, name, subresource="status"),
                {
                    "apiVersion": API_VERSION,
                    "kind": "ComposableResource",
                    "metadata": {"name": name},
                    "status": {"conditions": [written]},
                },
                self.manager,
            )
            self._log.info("device visibility", resource=name, visible=visible)
        except KubeError as exc:
            self._log.warning("could not write DeviceVisible", resource=name, error=str(exc))
