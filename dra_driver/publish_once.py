"""Publishing each GPU once: which of the node's GPUs its local slice may show.

A device whose ComposableResource has a ``claimRef`` serves (or is about to serve) an
allocation made through the fabric pool; it keeps that identity, so it is left out of the
node's local slice. Without a claimRef an attached GPU is an idle local device and is
published as one.

The fabric shows a GPU on the node before the operator has written its UUID to the
resource, so "no resource names this UUID" does not make a GPU local: while a resource
with a claimRef and no UUID yet targets the node, GPUs not already published stay out
(``publishable``). And a GPU is added to the local slice only after a consistent read of the
node's resources (not the watch cache) agrees: the scaler creates the resource before the
operator can attach anything, so that read always sees it (docs/attach-flow.md, Publishing
each GPU once).

The node's resources come from one Informer (``node_resources``), shared with
``dra_driver.device_visibility``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, NotFound, path
from composable_dra.model.names import normalize_uuid
from composable_dra.process import logs
from dra_driver.device_source import DeviceInfo

PLURAL = "composableresources"


def node_resources(kube: Kube, node: str, on_change: Callable[[], None]) -> Informer:
    """The ComposableResources whose ``spec.targetNode`` is ``node``, kept by a watch.

    No CRD means no fabric: an empty, synced cache, asked again now and then.
    """
    return Informer(
        kube,
        path(API_VERSION, PLURAL),
        on_change,
        name="composableresources",
        watch_timeout=60,
        retry_cap=30.0,
        missing_ok=True,
        fieldSelector=f"spec.targetNode={node}",
    )


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


class LocalSliceGate:
    """Hands the node's slice publisher the devices it may show; see the module docstring."""

    def __init__(
        self,
        kube: Kube,
        node: str,
        resources: Informer,
        devices: Callable[[], list[DeviceInfo]],
        publish: Callable[[list[DeviceInfo]], None],
    ) -> None:
        self.kube, self.node = kube, node
        self.resources = resources
        self._devices, self._publish = devices, publish
        # The last list handed to ``publish`` (None: none yet). A decision and its hand-over
        # happen under one lock, so an older decision never overwrites a newer one.
        self._last: list[DeviceInfo] | None = None
        self._publish_lock = threading.Lock()
        # UUIDs of the GPUs the node's resources name (named_uuids): the fabric's, never
        # lent. Set with each hand-over to ``publish``.
        self.fabric_uuids: frozenset[str] = frozenset()
        self._log = logs.get(__name__, node=node)

    def republish(self) -> None:
        """Hand the node's slices the devices they may show now, if that changed.

        Nothing until the resources are known (the informer has synced): a restarted plugin
        must not offer a GPU that serves a pool allocation as a free local device, even for
        a moment. A device joins the slice only when a consistent read of the node's
        resources agrees with the watch cache: a resource the cache has not seen yet may
        be the one this GPU was just attached for.
        """
        if not self.resources.synced.is_set():
            return
        with self._publish_lock:
            devices = self._devices()
            cached = self.resources.items()
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
