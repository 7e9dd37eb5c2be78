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

A GPU on its way off the node never joins the slice either: one that a resource being
deleted (or in phase Detaching or Detached) names, and one that such a resource no longer
names because it went away while the device source still lists the GPU (the source's
list may be a read from before the detach; ``held_back``). A GPU the gate held back stays
so until the source stops listing it or a live resource names it again. And the device
source is read afresh before any GPU joins: a resource that went away after its detach
says nothing about a GPU it never named (a cancelled attach's), and only a read after the
detach shows that GPU gone (docs/architecture.md, Invariants).

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


# Phases of a resource whose GPU is leaving the node (or has left it).
LEAVING_PHASES = frozenset({"Detaching", "Detached"})


@dataclass(frozen=True)
class Reservations:
    """What the node's ComposableResources say about its GPUs."""

    serving: frozenset[str]  # UUIDs that serve (or are about to serve) a pool allocation
    released: frozenset[str]  # UUIDs of released GPUs: idle, free for local use
    pending: bool  # an attach whose GPU is not identified yet (no deviceUUID)
    # UUIDs of GPUs on their way off the node: their resource is being deleted or detached.
    leaving: frozenset[str] = frozenset()
    named: frozenset[str] = frozenset()  # every UUID a resource names, in any phase


def is_leaving(r: JSON) -> bool:
    """Whether the resource's GPU is on its way off the node (or gone)."""
    phase = (r.get("status") or {}).get("phase")
    return bool((r.get("metadata") or {}).get("deletionTimestamp")) or phase in LEAVING_PHASES


def reservations(resources: Iterable[JSON]) -> Reservations:
    serving, released, leaving, pending = set(), set(), set(), False
    for r in resources:
        status = r.get("status") or {}
        uuid = normalize_uuid(str(status.get("deviceUUID") or ""))
        if is_leaving(r):
            # Its attach may still land (a resource deleted mid-attach): an unnamed GPU
            # may be that one.
            if uuid:
                leaving.add(uuid)
            else:
                pending = True
        elif (r.get("spec") or {}).get("claimRef"):
            # Any phase: a Failed attach may have attached the GPU all the same, and it
            # stays the pool allocation's until the resource is gone.
            if uuid:
                serving.add(uuid)
            else:
                pending = True
        elif uuid and status.get("phase") == "Online":
            released.add(uuid)
    return Reservations(
        frozenset(serving),
        frozenset(released),
        pending,
        frozenset(leaving),
        named_uuids(resources),
    )


def named_uuids(resources: Iterable[JSON]) -> frozenset[str]:
    """The GPUs the node's resources name, in any phase: the fabric's, never lent."""
    return frozenset(
        normalize_uuid(str(u))
        for r in resources
        if (u := (r.get("status") or {}).get("deviceUUID"))
    )


def held_back(held: Collection[str], res: Reservations, listed: Collection[str]) -> frozenset[str]:
    """The UUIDs kept out of the slice beyond what the resources say now: those that a
    resource kept out before (serving a pool allocation, or leaving), that no resource
    names any more and that the device source still lists. Its resource went away
    after the detach; the source's list may still be from before it."""
    before = frozenset(held) | res.serving | res.leaving
    return frozenset(before & frozenset(listed)) - (res.named - res.serving - res.leaving)


def publishable(
    devices: Sequence[DeviceInfo],
    res: Reservations,
    published: Collection[str],
    held: Collection[str] = frozenset(),
) -> list[DeviceInfo]:
    """The devices the node's local slice may show.

    Never one that serves a pool allocation. No device joins the slice while it is
    leaving the node or held back (``held_back``); one already shown stays, under the
    operator's detach taint, until the source stops listing it. While an attach on this
    node is not identified yet, no device joins the slice unless it is known: already
    published, or a released GPU (its resource names it); the unknown one may be that
    attach's GPU.
    """
    out = []
    for d in devices:
        uuid = normalize_uuid(d.uuid)
        if uuid in res.serving:
            continue
        if uuid not in published and (uuid in res.leaving or uuid in held):
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
        read_devices: Callable[[], list[DeviceInfo] | None] | None = None,
    ) -> None:
        self.kube, self.node = kube, node
        self.resources = resources
        self._devices, self._publish = devices, publish
        # A fresh read of the device source (None: unreadable); without one, the last list.
        self._read_devices = read_devices or devices
        # The last list handed to ``publish`` (None: none yet). A decision and its hand-over
        # happen under one lock, so an older decision never overwrites a newer one.
        self._last: list[DeviceInfo] | None = None
        self._publish_lock = threading.Lock()
        # UUIDs of the GPUs the node's resources name (named_uuids): the fabric's, never
        # lent. Set with each hand-over to ``publish``.
        self.fabric_uuids: frozenset[str] = frozenset()
        self.held: frozenset[str] = frozenset()  # held_back, as of the last decision
        self._log = logs.get(__name__, node=node)

    def _decide(
        self, devices: list[DeviceInfo], resources: list[JSON], published: set[str]
    ) -> tuple[list[DeviceInfo], frozenset[str]]:
        res = reservations(resources)
        held = held_back(self.held, res, {normalize_uuid(d.uuid) for d in devices})
        return publishable(devices, res, published, held), held

    def republish(self) -> None:
        """Hand the node's slices the devices they may show now, if that changed.

        Nothing until the resources are known (the informer has synced): a restarted plugin
        must not offer a GPU that serves a pool allocation as a free local device, even for
        a moment. A device joins the slice only when a consistent read of the node's
        resources and a fresh read of the device source agree with the caches: a resource
        the cache has not seen yet may be the one this GPU was just attached for, and a
        GPU the cached list shows may have been detached since.
        """
        if not self.resources.synced.is_set():
            return
        with self._publish_lock:
            devices = self._devices()
            cached = self.resources.items()
            published = {normalize_uuid(d.uuid) for d in self._last or []}
            source = cached
            out, held = self._decide(devices, cached, published)
            if {normalize_uuid(d.uuid) for d in out} - published:
                fresh, listed = self._read_resources(), self._read_devices()
                if (fresh is None or listed is None) and self._last is None:
                    return  # not known yet: publish nothing rather than an empty slice
                if fresh is None or listed is None:  # unknown: the slice may shrink, not grow
                    waiting = [d.name for d in out if normalize_uuid(d.uuid) not in published]
                    self._log.warning("devices not added", why="no fresh read", devices=waiting)
                    out = [d for d in out if normalize_uuid(d.uuid) in published]
                else:
                    source = fresh
                    out, held = self._decide(listed, fresh, published)
            if held - self.held:  # on their way off the node: never local devices
                names = [d.name for d in devices if normalize_uuid(d.uuid) in held - self.held]
                self._log.info("devices held back", why="leaving the node", devices=names)
            self.held = held
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
