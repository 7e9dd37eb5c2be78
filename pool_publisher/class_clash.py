"""DeviceClasses that map one extended resource name, one of them ours.

A pod that asks for an extended resource (``resources.limits: {nvidia.com/gpu: 1}``) gets
its claim from the DeviceClass whose ``spec.extendedResourceName`` is that name. When two
classes map it, kube-scheduler takes the one created later (ties: the name sorted first;
resource.k8s.io/v1 DeviceClass, ``extendedResourceName``) and says nothing: installing
NVIDIA's chart after ours, or ours after it, silently moves every such pod to the other
driver. The publisher cannot refuse another's class, so it warns: a log line, a Warning
Event and a metric naming both classes (docs/operations.md, "GPUs as an extended resource").

``clashes`` decides (pure); ``ClashReporter`` tells, once per change.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Gauge

from composable_dra.k8s.events import event_body
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.k8s.timestamps import format_time
from composable_dra.model import names
from composable_dra.process import logs

CLASS_CLASHES = Gauge(
    "composable_dra_pool_publisher_extended_resource_clashes",
    "1 for each extended resource name that a DeviceClass of ours and another class both "
    "map: the class kube-scheduler uses (winner) and the one it ignores (loser)",
    ["resource", "winner", "loser"],
)
REASON = "ExtendedResourceClash"
# The annotation the publisher sets on our class after a clash ended (to_refresh).
REFRESHED = f"{names.PREFIX}/extended-resource-refreshed"
COMPONENT = "composable-dra-pool-publisher"
# Events about cluster-scoped objects live in "default", where kubectl describe looks.
EVENT_NAMESPACE = "default"

log = logs.get(__name__)


@dataclass(frozen=True, order=True)
class Clash:
    """``resource`` is mapped by ``winner`` (the class the scheduler uses) and ``loser``."""

    resource: str
    winner: str
    loser: str

    def message(self) -> str:
        return (
            f"DeviceClasses {self.winner} and {self.loser} both map the extended resource "
            f"{self.resource}; kube-scheduler uses {self.winner} (created later) for pods "
            f"that ask for {self.resource}, and ignores {self.loser}"
        )


def selects_driver(device_class: JSON, driver: str) -> bool:
    """Whether a class's CEL selectors name ``driver`` (our classes select on it)."""
    quoted = (f'"{driver}"', f"'{driver}'")
    for sel in (device_class.get("spec") or {}).get("selectors") or []:
        expr = str((sel.get("cel") or {}).get("expression") or "")
        if "device.driver" in expr and any(q in expr for q in quoted):
            return True
    return False


def _scheduler_order(device_class: JSON) -> tuple[str, str]:
    """(creationTimestamp, name): kube-scheduler picks the newest, then the name sorted
    first. The API's RFC 3339 times (UTC, whole seconds) sort as text."""
    meta = device_class.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))


def by_name(classes: Iterable[JSON]) -> dict[str, list[JSON]]:
    """extendedResourceName -> the classes (not being deleted) that map it."""
    out: dict[str, list[JSON]] = {}
    for dc in classes:
        name = (dc.get("spec") or {}).get("extendedResourceName")
        if name and not (dc.get("metadata") or {}).get("deletionTimestamp"):
            out.setdefault(str(name), []).append(dc)
    return out


def clashes(classes: Iterable[JSON], driver: str) -> list[Clash]:
    """Each extended resource name that two or more classes map, one of them selecting
    ``driver``: one Clash per class the scheduler ignores, sorted."""
    found: list[Clash] = []
    for resource, mapped in by_name(classes).items():
        if len(mapped) < 2 or not any(selects_driver(dc, driver) for dc in mapped):
            continue
        # Newest first; among equals, the name sorted first.
        newest = max(_scheduler_order(dc)[0] for dc in mapped)
        winner = min(_scheduler_order(dc)[1] for dc in mapped if _scheduler_order(dc)[0] == newest)
        for dc in mapped:
            loser = _scheduler_order(dc)[1]
            if loser != winner:
                found.append(Clash(resource, winner, loser))
    return sorted(found)


def to_refresh(ended: Iterable[Clash], classes: Iterable[JSON], driver: str) -> list[str]:
    """Our classes to touch after clashes ended: kube-scheduler v1.37.1's cache drops a
    name when any class that mapped it is deleted or renamed (``removeResourceName2class``
    deletes the name whichever class held it), so a class of ours left alone mapping the
    name serves no pod until it changes. Ours only: another's class is not ours to write."""
    mapping = by_name(classes)
    out = set()
    for clash in ended:
        left = mapping.get(clash.resource, [])
        if len(left) == 1 and selects_driver(left[0], driver):
            out.add(str(left[0]["metadata"]["name"]))
    return sorted(out)


class ClashReporter:
    """Tells each new clash once (log, Warning Event on the ignored class, metric), clears
    the metric of those that ended, and touches our class that an ended clash left alone
    (``to_refresh``)."""

    def __init__(
        self,
        driver: str,
        post_event: Callable[[Clash], None],
        touch: Callable[[str], None] = lambda _: None,
    ) -> None:
        self._driver = driver
        self._post_event = post_event
        self._touch = touch
        self._known: set[Clash] = set()

    def check(self, classes: Iterable[JSON]) -> list[Clash]:
        classes = list(classes)
        now = clashes(classes, self._driver)
        ended = self._known - set(now)
        for gone in ended:
            CLASS_CLASHES.remove(gone.resource, gone.winner, gone.loser)
            log.info("extended resource clash ended", resource=gone.resource, loser=gone.loser)
        for name in to_refresh(ended, classes, self._driver):
            self._touch(name)
        for new in sorted(set(now) - self._known):
            CLASS_CLASHES.labels(new.resource, new.winner, new.loser).set(1)
            log.warning(
                "two DeviceClasses map one extended resource",
                resource=new.resource,
                winner=new.winner,
                loser=new.loser,
            )
            self._post_event(new)
        self._known = set(now)
        return now


def clash_event(clash: Clash, uid: str) -> JSON:
    """A Warning Event on the class the scheduler ignores."""
    involved = {
        "kind": "DeviceClass",
        "apiVersion": "resource.k8s.io/v1",
        "name": clash.loser,
        "uid": uid,
    }
    return event_body(involved, EVENT_NAMESPACE, "Warning", REASON, clash.message(), COMPONENT)


class ClassClashWatch:
    """The publisher's DeviceClass informer and its reporter; ``check`` on each pass."""

    def __init__(self, kube: Kube, driver: str, wake: Callable[[], None]) -> None:
        self._kube = kube
        self.informer = Informer(kube, path("resource.k8s.io/v1", "deviceclasses"), wake)
        self._reporter = ClashReporter(driver, self._post, self._refresh)

    def check(self) -> list[Clash]:
        return self._reporter.check(self.informer.items())

    def selecting(self, drivers: Iterable[str]) -> set[str]:
        """The names of the classes whose selectors name one of ``drivers``."""
        return {
            str(dc["metadata"]["name"])
            for dc in self.informer.items()
            if any(selects_driver(dc, d) for d in drivers)
        }

    def _post(self, clash: Clash) -> None:
        uid = next(
            (
                str(dc["metadata"].get("uid") or "")
                for dc in self.informer.items()
                if dc["metadata"]["name"] == clash.loser
            ),
            "",
        )
        # Events are for people: a failed post loses nothing the log and metric keep.
        with contextlib.suppress(KubeError):
            self._kube.create(
                path("v1", "events", namespace=EVENT_NAMESPACE), clash_event(clash, uid)
            )

    def _refresh(self, name: str) -> None:
        """Change our class so that kube-scheduler maps its name again (``to_refresh``)."""
        patch = {"metadata": {"annotations": {REFRESHED: format_time(time.time())}}}
        try:
            self._kube.merge_patch(path("resource.k8s.io/v1", "deviceclasses", name), patch)
        except KubeError as exc:
            log.warning(
                "could not refresh the DeviceClass; annotate it by hand",
                device_class=name,
                error=str(exc),
            )
            return
        log.info("extended resource mapping refreshed", device_class=name)
