"""Every version of a namespace's ResourceClaims, recorded from a watch.

A claim's allocation and device conditions last only while a pod uses it: a templated
claim is deleted, a named one deallocated, once its pod has finished. A test that waits
for the end reads what the claim said on the way here.
"""

from __future__ import annotations

import contextlib
import threading

from composable_dra.kube import JSON, Kube, path

RESOURCE = "resource.k8s.io/v1"


class ClaimsSeen:
    def __init__(self, kube: Kube, namespace: str, timeout: int = 300) -> None:
        self.url = path(RESOURCE, "resourceclaims", namespace=namespace)
        self.kube = kube
        self._rv = kube.get(self.url)["metadata"]["resourceVersion"]
        self._lock = threading.Lock()
        self._versions: dict[str, list[JSON]] = {}
        self._timeout = timeout
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        # Ends with its timeout, or when the test's control plane goes away under it.
        with contextlib.suppress(Exception):
            for event in self.kube.watch(self.url, self._rv, self._timeout):
                if event["type"] in ("ADDED", "MODIFIED"):
                    obj = event["object"]
                    with self._lock:
                        self._versions.setdefault(obj["metadata"]["name"], []).append(obj)

    def versions(self, name: str) -> list[JSON]:
        with self._lock:
            return list(self._versions.get(name, []))

    def allocated(self, name: str) -> JSON | None:
        """The last version of the claim that had an allocation."""
        found = [c for c in self.versions(name) if (c.get("status") or {}).get("allocation")]
        return found[-1] if found else None
