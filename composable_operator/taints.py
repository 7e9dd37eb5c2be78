"""The detach-time DeviceTaintRules: a device being detached is tainted NoSchedule under
every (pool, device) name it can be allocated by, so that no new claim takes it while
the detach re-checks allocations; the rules go once the resource is let go."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from composable_dra.k8s.kube import JSON, Conflict, Kube, path
from composable_dra.model import names

RESOURCE = "resource.k8s.io/v1"


def rule_name(name: str) -> str:
    return f"detach-{name}"[:253]


@dataclass
class Taints:
    kube: Kube
    driver: str

    def taint(self, name: str, refs: set[tuple[str, str]]) -> None:
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
            with contextlib.suppress(Conflict):  # already tainted by an earlier pass
                self.kube.create(path(RESOURCE, "devicetaintrules"), body)

    def rules(self, name: str) -> list[JSON]:
        items: list[JSON] = self.kube.get(
            path(RESOURCE, "devicetaintrules"), labelSelector=f"{names.PREFIX}/resource={name}"
        )["items"]
        return items

    def untaint(self, name: str) -> None:
        for rule in self.rules(name):
            self.kube.delete(path(RESOURCE, "devicetaintrules", rule["metadata"]["name"]))
