"""The ComposableResource controller's parts, wired once (main.py; tests build their own).

Each part owns its state behind a small interface; none reaches into another's:

- ``StatusWrites`` (status_writes.py): what this operator owns of each status, written
  in order, one server-side apply a step.
- ``AttachCalls`` (attach_calls.py): this process's attach requests and their record in
  status.pendingAttach.
- ``Picks`` (picks.py): the devices a fabric that picks has attached for our resources.
- ``ClusterReads`` (reads.py): the reads a decision needs (device, node, host, claims,
  slices), from the watches' cache unless a read must be consistent.
- ``Taints`` (taints.py): the detach-time DeviceTaintRules.
- ``Detacher`` (detach.py): the deletion handler's detach, with its unpublish waits.
- ``Inventories`` (inventories.py): the Fabric daemon's latest inventory and hosts.
- ``ResourceEvents`` (resource_events.py): wakes a resource's daemon on its next event.

The kopf handlers (handlers.py) and the attach daemon (attach_daemon.py) drive them; the
decisions are in reconcile.py. Blocking calls (the fabric, the API server) run in
threads, off the event loop.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from composable_dra.fabric.registry import Fabrics
from composable_dra.k8s.kube import Kube
from composable_dra.model import names
from composable_operator.attach_calls import AttachCalls
from composable_operator.cluster_cache import ClusterCache
from composable_operator.detach import Detacher
from composable_operator.inventories import Inventories
from composable_operator.picks import Picks
from composable_operator.reads import ClusterReads
from composable_operator.reconcile import UNPUBLISH_LIMIT_SECONDS
from composable_operator.resource_events import ResourceEvents
from composable_operator.status_writes import StatusWrites
from composable_operator.taints import Taints


@dataclass
class ControllerSettings:
    driver: str = names.DRIVER
    online_poll: float = 10.0
    backoff_max: float = 30.0
    unpublish_limit: float = UNPUBLISH_LIMIT_SECONDS
    # None: detach without asking the node's plugin for a host release first.
    release_limit: float | None = None


@dataclass
class Controller:
    kube: Kube
    fabrics: Fabrics
    settings: ControllerSettings = field(default_factory=ControllerSettings)
    # ResourceClaims, our ResourceSlices and Nodes kept by watches (started by the
    # operator), for ClusterReads; None: every read lists.
    cache: InitVar[ClusterCache | None] = None
    statuses: StatusWrites = field(init=False)
    attaches: AttachCalls = field(init=False)
    picks: Picks = field(init=False)
    inventories: Inventories = field(init=False, default_factory=Inventories)
    resource_events: ResourceEvents = field(init=False, default_factory=ResourceEvents)
    reads: ClusterReads = field(init=False)
    taints: Taints = field(init=False)
    detacher: Detacher = field(init=False)

    def __post_init__(self, cache: ClusterCache | None) -> None:
        driver = self.settings.driver
        self.statuses = StatusWrites(self.kube)
        self.attaches = AttachCalls(self.statuses)
        self.picks = Picks(self.kube, self.attaches)
        self.reads = ClusterReads(self.kube, driver, self.inventories, self.picks, cache)
        self.taints = Taints(self.kube, driver)
        self.detacher = Detacher(
            self.fabrics,
            self.statuses,
            self.attaches,
            self.picks,
            self.reads,
            self.taints,
            self.settings.unpublish_limit,
            release_limit=self.settings.release_limit,
        )
