"""Every version of a namespace's ResourceClaims, recorded from a watch.

A claim's allocation and device conditions last only while a pod uses it: a templated
claim is deleted, a named one deallocated, once its pod has finished. A test that waits
for the end reads what the claim said on the way here.

The watch is the suite's one way to watch, composable_dra.k8s.informer.Informer: it resumes a
broken watch from the last version it saw (so no version in between is missed) and
relists on 410 Gone; each version it hears of is recorded here (read-only objects).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, path
from testbed.wait import wait_for

RESOURCE = "resource.k8s.io/v1"


class ClaimsSeen:
    """Records from construction (once its first list is in) until ``timeout`` seconds
    later or ``stop()``."""

    def __init__(self, kube: Kube, namespace: str, timeout: int = 300) -> None:
        self.url = path(RESOURCE, "resourceclaims", namespace=namespace)
        self.namespace = namespace
        self.kube = kube
        self._lock = threading.Lock()
        self._versions: dict[str, list[JSON]] = {}
        self._events = 0  # of any claim: for a failure message, whether the watch is alive
        self._last_event = time.monotonic()
        self._informer = Informer(kube, self.url, on_event=self._on_event, name="claims-seen")
        self._informer.start()
        # Its end, as before the Informer: a test that forgets it leaves no watch behind.
        self._timer = threading.Timer(timeout, self._informer.stop)
        self._timer.daemon = True
        self._timer.start()
        if not self._informer.synced.wait(30):
            self.stop()
            raise TimeoutError(f"the claims of {namespace} were not listed within 30s")

    def stop(self) -> None:
        self._timer.cancel()
        self._informer.stop()

    def _on_event(self, kind: str, obj: JSON) -> None:
        with self._lock:
            self._events += 1
            self._last_event = time.monotonic()
            if kind in ("ADDED", "MODIFIED"):
                self._versions.setdefault(obj["metadata"]["name"], []).append(obj)

    def _record(self, obj: JSON) -> None:
        """A version read with a GET, unless the watch has recorded it already."""
        name, rv = obj["metadata"]["name"], obj["metadata"].get("resourceVersion")
        with self._lock:
            known = self._versions.setdefault(name, [])
            if all(v["metadata"].get("resourceVersion") != rv for v in known):
                known.append(obj)

    def wait_pod_ended(
        self, pod: str, timeout: float, describe: Callable[[], str] | None = None
    ) -> JSON:
        """Pod ``pod`` (of this namespace) once it has ended, Succeeded or Failed.

        Each poll also reads the pod's claims and records an allocated one: a templated
        claim is deleted as its pod ends, and once (CI) the watch had delivered nothing
        past a claim's creation 35 s later, with no watch error, so the watch alone may
        miss a short pod's allocation.
        """
        url = path("v1", "pods", pod, namespace=self.namespace)

        def ended() -> JSON | None:
            found = self.kube.get_or_none(url) or {}
            status = found.get("status") or {}
            for claim in status.get("resourceClaimStatuses") or []:
                name = claim.get("resourceClaimName")
                got = name and self.kube.get_or_none(
                    path(RESOURCE, "resourceclaims", name, namespace=self.namespace)
                )
                if got and (got.get("status") or {}).get("allocation"):
                    self._record(got)
            return found if status.get("phase") in ("Succeeded", "Failed") else None

        done: JSON = wait_for(ended, timeout, f"pod {pod} to end", describe=describe)
        return done

    def versions(self, name: str) -> list[JSON]:
        with self._lock:
            return list(self._versions.get(name, []))

    def allocated(self, name: str) -> JSON | None:
        """The last version of the claim that had an allocation."""
        found = [c for c in self.versions(name) if (c.get("status") or {}).get("allocation")]
        return found[-1] if found else None

    def describe(self, name: str) -> str:
        """For a failure message: the versions of ``name`` seen (the watch's failures are
        in the informer's log)."""
        phases = [bool((c.get("status") or {}).get("allocation")) for c in self.versions(name)]
        with self._lock:
            events, quiet = self._events, time.monotonic() - self._last_event
        return (
            f"claim {name}: versions seen, allocated or not: {phases}; "
            f"{events} events of the namespace's claims, the last {quiet:.1f}s ago"
        )

    def wait_allocated(self, name: str, what: str, timeout: float = 30) -> JSON:
        """The last version of ``name`` with an allocation, once the watch has seen one."""
        found: JSON = wait_for(
            lambda: self.allocated(name), timeout, what, describe=lambda: self.describe(name)
        )
        return found
