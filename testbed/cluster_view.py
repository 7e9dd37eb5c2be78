"""What one suite's cluster says: its pods, claims, pools, resources, and the fabric's state.

Read-only; the scenario helpers (testbed.workload) and the lifecycle (testbed.harness)
build on it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from fabric_emulator.testing import EmulatorProcess
from testbed.objects import RESOURCE
from testbed.process import ComponentProcess
from testbed.realnode import RealNode
from testbed.suite_nodes import SuiteNode, SuiteNodes, on_nodes

CR_API = API_VERSION


class ClusterView:
    def __init__(
        self,
        kube: Kube,
        fabric: str,
        emulator: EmulatorProcess,
        hosts: SuiteNodes,
        components: Callable[[], list[ComponentProcess]],
    ) -> None:
        self.kube = kube
        self.fabric = fabric
        self.emulator = emulator
        self.hosts = hosts
        self._components = components

    # -- the nodes --------------------------------------------------------------------

    @property
    def nodes(self) -> dict[str, SuiteNode]:
        """host id -> emulated node"""
        return self.hosts.emulated

    @property
    def real_nodes(self) -> dict[str, RealNode]:
        """host id -> real node"""
        return self.hosts.real

    def node_of(self, host: str) -> str:
        return self.hosts.node_of(host)

    def node_names(self) -> list[str]:
        """The names of this suite's nodes, emulated and real."""
        return self.hosts.names()

    def host_of_node(self, node: str) -> str:
        return self.hosts.host_of(node)

    def on_own_nodes(self, pod: JSON) -> JSON:
        """``pod`` kept to this suite's nodes (testbed.suite_nodes.on_nodes)."""
        return on_nodes(pod, self.hosts.names())

    # -- the cluster's objects ----------------------------------------------------------

    def pod(self, namespace: str, name: str) -> JSON:
        return self.kube.get(path("v1", "pods", name, namespace=namespace))

    def claim(self, namespace: str, name: str) -> JSON:
        return self.kube.get(path(RESOURCE, "resourceclaims", name, namespace=namespace))

    def running(self, namespace: str, name: str) -> bool:
        return bool(self.pod(namespace, name).get("status", {}).get("phase") == "Running")

    def pool_slices(self) -> list[JSON]:
        items: list[JSON] = self.kube.get(
            path(RESOURCE, "resourceslices"),
            labelSelector=f"{names.LABEL_FABRIC}={self.fabric}",
        )["items"]
        return items

    def pool_devices(self) -> set[tuple[str, str]]:
        return {
            (s["spec"]["pool"]["name"], d["name"])
            for s in self.pool_slices()
            for d in s["spec"].get("devices", [])
        }

    def local_devices(self, host: str) -> list[JSON]:
        node = self.node_of(host)
        slices = self.kube.get(
            path(RESOURCE, "resourceslices"),
            fieldSelector=f"spec.nodeName={node},spec.driver={names.DRIVER}",
        )["items"]
        return [d for s in slices for d in s["spec"].get("devices", [])]

    def resources(self) -> list[JSON]:
        items: list[JSON] = [
            r
            for r in self.kube.get(path(CR_API, "composableresources"))["items"]
            if r["spec"].get("fabric") == self.fabric
        ]
        return items

    def composed(self) -> dict[str, str]:
        """block id -> host, for every block the emulator has composed (attached)."""
        out = {}
        for bid, block in self.emulator.state().get("blocks", {}).items():
            if block.get("state") == "Composed" and block.get("system"):
                out[bid] = block["system"]
        return out

    def pod_events(self, namespace: str, name: str) -> list[JSON]:
        items: list[JSON] = self.kube.get(
            path("v1", "events", namespace=namespace),
            fieldSelector=f"involvedObject.name={name},involvedObject.kind=Pod",
        )["items"]
        return items

    def describe(self) -> str:
        parts = []
        for c in self._components():
            parts.append(f"--- {c.name} (alive={c.alive()}) ---\n{c.log_tail(15)}")
        with contextlib.suppress(Exception):
            parts.append(f"--- emulator composed: {self.composed()}")
        with contextlib.suppress(Exception):
            parts.append(
                "--- resources: "
                + json.dumps(
                    [
                        (
                            r["metadata"]["name"],
                            r["spec"].get("deviceID"),
                            r["spec"].get("targetNode"),
                            (r.get("status") or {}).get("phase"),
                            bool(r["spec"].get("claimRef")),
                        )
                        for r in self.resources()
                    ]
                )
            )
        return "\n".join(parts)
