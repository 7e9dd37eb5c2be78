"""Every version of a namespace's ResourceClaims, recorded from a watch.

A claim's allocation and device conditions last only while a pod uses it: a templated
claim is deleted, a named one deallocated, once its pod has finished. A test that waits
for the end reads what the claim said on the way here.
"""

from __future__ import annotations

import threading
import time

from composable_dra.k8s.kube import JSON, Gone, Kube, path
from hack.localcluster.wait import wait_for

RESOURCE = "resource.k8s.io/v1"


class ClaimsSeen:
    def __init__(self, kube: Kube, namespace: str, timeout: int = 300) -> None:
        self.url = path(RESOURCE, "resourceclaims", namespace=namespace)
        self.kube = kube
        self._rv = kube.get(self.url)["metadata"]["resourceVersion"]
        self._lock = threading.Lock()
        self._versions: dict[str, list[JSON]] = {}
        self._timeout = timeout
        self._retry = threading.Event()  # never set: its wait is the back-off
        self.errors: list[str] = []
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        # Until its timeout: a watch that breaks (a loaded machine, a dropped connection)
        # resumes from the last version it saw, so no version in between is missed; the
        # errors are kept for the test's failure message. Ends with the control plane.
        deadline = time.monotonic() + self._timeout
        rv = self._rv
        while (left := int(deadline - time.monotonic())) > 0:
            try:
                for event in self.kube.watch(self.url, rv, left):
                    obj = event["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(obj)
            except Gone:  # too old to resume: what is there now is the best left
                listed = self.kube.get(self.url)
                rv = listed["metadata"]["resourceVersion"]
                for obj in listed.get("items") or []:
                    self._record(obj)
            except Exception as exc:
                self.errors.append(repr(exc))
                self._retry.wait(0.5)  # a back-off between attempts, not a synchronisation

    def _record(self, obj: JSON) -> None:
        with self._lock:
            self._versions.setdefault(obj["metadata"]["name"], []).append(obj)

    def versions(self, name: str) -> list[JSON]:
        with self._lock:
            return list(self._versions.get(name, []))

    def allocated(self, name: str) -> JSON | None:
        """The last version of the claim that had an allocation."""
        found = [c for c in self.versions(name) if (c.get("status") or {}).get("allocation")]
        return found[-1] if found else None

    def describe(self, name: str) -> str:
        """For a failure message: the versions of ``name`` seen, and the watch's errors."""
        phases = [bool((c.get("status") or {}).get("allocation")) for c in self.versions(name)]
        return (
            f"claim {name}: versions seen, allocated or not: {phases}; watch errors: {self.errors}"
        )

    def wait_allocated(self, name: str, what: str, timeout: float = 30) -> JSON:
        """The last version of ``name`` with an allocation, once the watch has seen one."""
        found: JSON = wait_for(
            lambda: self.allocated(name), timeout, what, describe=lambda: self.describe(name)
        )
        return found
