"""The detach-time DeviceTaintRules: a device being detached is tainted NoSchedule under
every (pool, device) name it can be allocated by, so that no new claim takes it while
the detach re-checks allocations; the rules go once the resource is let go.

An API server that serves no ``resource.k8s.io/v1`` DeviceTaintRules (v1.35, v1.36) answers
404: then nothing is tainted (``served`` turns false) and the detach re-checks allocations
without that guard (docs/operations.md, Support matrix)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from composable_dra.k8s.kube import JSON, Conflict, Kube, NotFound, path
from composable_dra.model import names
from composable_dra.process import logs

log = logs.get(__name__)

RESOURCE = "resource.k8s.io/v1"


def rule_name(name: str) -> str:
    return f"detach-{name}"[:253]


@dataclass
class Taints:
    kube: Kube
    driver: str
    served: bool = True  # false once the server answered 404 for DeviceTaintRules

    def _not_served(self) -> None:
        if self.served:
            log.warning(
                "no DeviceTaintRules on this API server",
                api=RESOURCE,
                then="a detach re-checks allocations without tainting the device first",
            )
        self.served = False

    def taint(self, name: str, refs: set[tuple[str, str]]) -> None:
        if not self.served:
            return
        for i, (pool, device) in enumerate(sorted(refs)):
            body = {
                "apiVersion": RESOURCE,
                "kind": "DeviceTaintRule",
                "metadata": {
                    "name": f"{rule_name(name)}-{i}",
                    "labels": {names.LABEL_FABRIC: "detach", f"{names.PREFIX}/resource": name},
                },
                "spec": {
                    "deviceSelector": {"driver": self.driver, "pool": pool, "device": device},
                    "taint": {"key": names.TAINT_KEY, "value": name, "effect": "NoSchedule"},
                },
            }
            try:
                with contextlib.suppress(Conflict):  # already tainted by an earlier pass
                    self.kube.create(path(RESOURCE, "devicetaintrules"), body)
            except NotFound:
                self._not_served()
                return

    def rules(self, name: str) -> list[JSON]:
        try:
            items: list[JSON] = self.kube.get(
                path(RESOURCE, "devicetaintrules"),
                labelSelector=f"{names.PREFIX}/resource={name}",
            )["items"]
        except NotFound:
            self._not_served()
            return []
        return items

    def untaint(self, name: str) -> None:
        for rule in self.rules(name):
            self.kube.delete(path(RESOURCE, "devicetaintrules", rule["metadata"]["name"]))
