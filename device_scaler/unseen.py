"""The scaler's writes that its caches do not show yet.

A pass decides from the informers' caches. A write it sent (a ComposableResource created,
a claim's status applied) reaches the cache a watch event later, and a pass that runs in
between decides the same write again: a create answered 409, a status applied twice,
each an API request, and on a busy API server one that the next claim waits behind.
So each write is remembered until the cache shows it (the resource is there; the claim
has moved past the version the decision was made on), or failed, or ``settle`` seconds
passed (a watch that lost it): until then the same write is not sent again.

It is also what lets a pass send these writes without waiting for them (scaler.py): the
next claim's pass runs while the last claim's create is on its way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from device_scaler.decide import CreateResource, DeleteResource, SetDeviceStatus

# Longer than a watch event takes to follow its write, short enough that a lost event
# costs little: the write is decided again.
SETTLE_SECONDS = 10.0


def status_key(action: SetDeviceStatus) -> str:
    return f"{action.claim.namespace}/{action.claim.name}"


@dataclass
class Unseen:
    """Writes sent (or on their way) that the cache does not show yet; thread-safe."""

    clock: Callable[[], float]
    settle: float = SETTLE_SECONDS
    # resource name -> when its create was sent
    creates: dict[str, float] = field(default_factory=dict)
    # claim "namespace/name" -> (the claim's resourceVersion decided on, when sent)
    statuses: dict[str, tuple[str, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def forget_seen(
        self, has_resource: Callable[[str], bool], claim_version: Callable[[str], str | None]
    ) -> None:
        """Drop what the caches show now, and what is older than ``settle``.

        ``has_resource(name)``: the ComposableResource is cached; ``claim_version(key)``:
        the cached claim's resourceVersion ("namespace/name"; None: gone, which counts
        as seen).
        """
        now = self.clock()
        with self._lock:
            self.creates = {
                n: t
                for n, t in self.creates.items()
                if not has_resource(n) and now - t < self.settle
            }
            self.statuses = {
                k: (rv, t)
                for k, (rv, t) in self.statuses.items()
                if claim_version(k) == rv and now - t < self.settle
            }

    def pending(self, action: object) -> bool:
        """True: this write was sent and the cache does not show it yet."""
        with self._lock:
            if isinstance(action, CreateResource):
                return action.name in self.creates
            if isinstance(action, SetDeviceStatus):
                return status_key(action) in self.statuses
        return False

    def sent(self, action: object) -> None:
        """Remember a write about to go out (a status with the resourceVersion of the
        claim it was decided on)."""
        now = self.clock()
        with self._lock:
            if isinstance(action, CreateResource):
                self.creates[action.name] = now
            elif isinstance(action, SetDeviceStatus):
                self.statuses[status_key(action)] = (action.version, now)

    def failed(self, action: object) -> None:
        """The write did not happen: decide it again."""
        with self._lock:
            if isinstance(action, CreateResource):
                self.creates.pop(action.name, None)
            elif isinstance(action, SetDeviceStatus):
                self.statuses.pop(status_key(action), None)


def hold_back(
    actions: Iterable[object], unseen: Unseen, claim_of: Callable[[str], str | None]
) -> list[object]:
    """``actions`` less the writes ``unseen`` still waits to see, and less the deletes of
    a claim whose status write is held back: decide orders a claim's failure before its
    resource's delete, and a status held back must not be overtaken by that delete.

    ``claim_of(resource)``: the uid of the claim a resource serves (None: none).
    """
    actions = list(actions)
    held = {a.claim.uid for a in actions if isinstance(a, SetDeviceStatus) and unseen.pending(a)}
    return [
        a
        for a in actions
        if not unseen.pending(a)
        and not (isinstance(a, DeleteResource) and held and claim_of(a.name) in held)
    ]
