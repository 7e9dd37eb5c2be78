"""A test harness: the whole suite of components on a control plane, each a process of its own.

Used by the end-to-end tests (tests/e2e/test_attach_flow.py), the demo and the
time-to-GPU benchmark::

    suite = Suite(kube, kubeconfig, workdir, SuiteOptions(...))
    suite.start()            # emulator, Fabric, nodes + kubelet emulators + plugins,
                             # operator, pool publisher, scaler; waits until ready
    suite.create_pod(namespace, "p1")
    ...
    suite.stop()

Nodes are fake (hack.localcluster.nodes) with the systemUUID of a fabric host, so the
operator and the pool publisher map them to the emulator's hosts; each node's plugin
reads the GPUs attached to its host from the emulator (the redfish device source).
The hosts named in ``SuiteOptions.real_hosts`` run as real nodes instead
(hack.localcluster.realnode: the upstream kubelet, containerd, runc), whose kubelet
reports the host's systemUUID; their pods run real containers.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import JSON, Conflict, Kube, path
from composable_dra.model import names
from fabric_emulator import topology as emulator_topology
from fabric_emulator.fsas.config import FsasConfig, process_args
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import host_uuid
from hack import examples
from hack.localcluster.controlplane import ControlPlane
from hack.localcluster.crds import install_crds
from hack.localcluster.kubelet_emulator import RUN_SECONDS_ANNOTATION, KubeletEmulator
from hack.localcluster.nodes import create_node, delete_node
from hack.localcluster.objects import HOSTNAME, RESOURCE, pod_body
from hack.localcluster.plugin_process import PluginProcess
from hack.localcluster.process import ComponentProcess
from hack.localcluster.realnode import RealNode
from hack.localcluster.realnode_pods import for_real_node
from hack.localcluster.wait import wait_for

CR_API = API_VERSION
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
_CLAIM_PLURALS = {
    "ResourceClaim": "resourceclaims",
    "ResourceClaimTemplate": "resourceclaimtemplates",
}
LOCAL_ONLY_CEL = f'!("blockID" in device.attributes["{names.DRIVER}"])'


def claim_body(name: str, local_first: bool = True) -> JSON:
    """A claim for one GPU: a node's own first, else a pool's (``local_first``), or any."""
    if local_first:
        request: JSON = {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "local",
                    "deviceClassName": names.DEVICE_CLASS,
                    "selectors": [{"cel": {"expression": LOCAL_ONLY_CEL}}],
                },
                {"name": "pool", "deviceClassName": names.DEVICE_CLASS},
            ],
        }
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS}}
    return {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}


@dataclass
class SuiteNode:
    name: str
    host: str
    kubelet: KubeletEmulator
    plugin: PluginProcess


@dataclass
class SuiteOptions:
    hosts: tuple[str, ...] = ("node-1", "node-2", "node-3")
    topology: dict[str, Any] | None = None  # None: the emulator's default
    async_polls: int = 1
    retry_after: int = 0
    attach_latency: float = 0.3  # seconds added to each composition request
    no_removal: float = 600.0
    attach_timeout: float = 60.0
    quarantine: float = 60.0
    poll_interval_seconds: int = 5
    plugin_poll: float = 0.5
    lease_duration: int = 4
    leader_elect_operator: bool = False
    run_operator: bool = True
    operator_args: list[str] = field(default_factory=list)
    scaler_args: list[str] = field(default_factory=list)
    publisher_args: list[str] = field(default_factory=list)
    # Hosts (of ``hosts``) that run as real nodes; they need Suite(control_plane=...)
    # and the node binaries (hack.localcluster.realnode.find_node_binaries).
    real_hosts: tuple[str, ...] = ()
    node_bin_dir: Path | None = None
    # Seconds to wait for the first pools, the scaler's lease and the Fabric's first sync
    # (a large fabric's first inventory read takes longer).
    start_timeout: float = 60.0
    # The Fabric speaks the emulator's Fsas FM API (backend fsas-fm) with this config;
    # with attach_by_model the FM picks the GPU and the Fabric says attachBy model.
    fsas: FsasConfig | None = None


class Suite:
    def __init__(
        self,
        kube: Kube,
        kubeconfig: Path,
        workdir: Path,
        options: SuiteOptions | None = None,
        suffix: str | None = None,
        control_plane: ControlPlane | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.kube = kube
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.opts = options or SuiteOptions()
        self.suffix = suffix or uuid.uuid4().hex[:5]
        self.fabric = f"fab-{self.suffix}"
        self.system_namespace = f"cdra-{self.suffix}"
        self.emulator = EmulatorProcess(
            async_polls=self.opts.async_polls,
            retry_after=self.opts.retry_after,
            topology=self.opts.topology,
            workdir=workdir / "emulator",
            extra_args=process_args(workdir / "emulator", fsas) if (fsas := self.opts.fsas) else (),
        )
        self.nodes: dict[str, SuiteNode] = {}  # host id -> node
        self.real_nodes: dict[str, RealNode] = {}  # host id -> real node
        self.operator: ComponentProcess | None = None
        self.publisher: ComponentProcess | None = None
        self.scaler: ComponentProcess | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Suite:
        """Start everything and wait until it is ready; on failure stop what started."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> Suite:
        (self.workdir / "emulator").mkdir(parents=True, exist_ok=True)
        install_crds(self.kube)
        self._device_class()
        self.emulator.start(timeout=max(30.0, self.opts.start_timeout))
        if self.opts.attach_latency > 0:
            self.emulator.add_fault(
                {
                    "kind": "latency",
                    "method": "POST|PATCH",
                    "path": "ResourceBlock|/Systems/",
                    "latency": self.opts.attach_latency,
                }
            )
        self.kube.create(path("v1", "namespaces"), {"metadata": {"name": self.system_namespace}})
        self._fabric_objects()
        for host in self.opts.hosts:
            if host in self.opts.real_hosts:
                self.add_real_node(host)
            else:
                self.add_node(host)
        common = [f"--kubeconfig={self.kubeconfig}"]
        lease = [
            f"--leader-elect-namespace={self.system_namespace}",
            f"--leader-elect-lease-duration={self.opts.lease_duration}",
            f"--leader-elect-renew-deadline={max(2, self.opts.lease_duration - 1)}",
            "--leader-elect-retry-period=1",
        ]
        op_args = ["operator", *common, "--metrics-port=0", *self.opts.operator_args]
        op_args += (
            [f"--leader-elect-namespace={self.system_namespace}"]
            if self.opts.leader_elect_operator
            else ["--no-leader-elect"]
        )
        if self.opts.run_operator:
            self.operator = ComponentProcess("operator", op_args[1:], self.workdir / "logs")
        self.publisher = ComponentProcess(
            "pool-publisher", [*common, *lease, *self.opts.publisher_args], self.workdir / "logs"
        )
        self.scaler = ComponentProcess(
            "scaler",
            [
                *common,
                *lease,
                f"--no-removal-duration={self.opts.no_removal}",
                f"--attach-timeout={self.opts.attach_timeout}",
                f"--failure-quarantine={self.opts.quarantine}",
                "--resync=0.5",
                *self.opts.scaler_args,
            ],
            self.workdir / "logs",
        )
        for c in self.components:
            c.start()
        for n in self.nodes.values():
            self.wait_registered(n)
        wait_for(
            lambda: len(self.pool_slices()) >= 1,
            self.opts.start_timeout,
            "the pool publisher to publish the fabric's pools",
            describe=self.describe,
        )
        wait_for(
            lambda: self.kube.get_or_none(
                path(
                    "coordination.k8s.io/v1",
                    "leases",
                    "composable-dra-scaler",
                    namespace=self.system_namespace,
                )
            ),
            self.opts.start_timeout,
            "the scaler's lease",
            describe=self.describe,
        )
        # Its caches synced: a claim allocated now is the scaler's at once (the
        # benchmarks time the scaler's share from the allocation).
        scaler = self.scaler
        wait_for(
            lambda: any(
                e.get("event") == "first pass done" for e in scaler.log_events(current_only=True)
            ),
            self.opts.start_timeout,
            "the scaler's first pass",
            describe=self.describe,
        )
        if self.operator is not None:
            # The operator's Fabric daemon has run once: kopf is up and handling.
            wait_for(
                lambda: (
                    self.kube.get(path(CR_API, "fabrics", self.fabric)).get("status") or {}
                ).get("lastSyncTime"),
                self.opts.start_timeout,
                "the operator to sync the Fabric",
                describe=self.describe,
            )
        return self

    @property
    def components(self) -> list[ComponentProcess]:
        return [c for c in (self.operator, self.publisher, self.scaler) if c is not None]

    def stop(self) -> None:
        # Give the fabric back before the operator goes: the scaler first (it would create
        # resources for pending allocations), then every resource of this fabric, force
        # detached, so that no finalizer outlives the suite on a shared control plane.
        if self.scaler is not None:
            self.scaler.stop()
        if self.operator is not None and self.operator.alive():
            with contextlib.suppress(Exception):
                for r in self.resources():
                    r_path = path(CR_API, "composableresources", r["metadata"]["name"])
                    self.kube.merge_patch(r_path, {"spec": {"forceDetach": True}})
                    self.kube.delete(r_path)
                wait_for(lambda: not self.resources(), 60, "the suite's resources to go")
        for c in self.components:
            c.stop()
        for n in self.nodes.values():
            n.plugin.stop()
            n.kubelet.stop()
            with contextlib.suppress(Exception):
                delete_node(self.kube.api, n.name)
        for real in self.real_nodes.values():
            real.stop()  # its plugin too; deletes its Node
        self.emulator.close()
        with contextlib.suppress(Exception):
            self.kube.delete(path(CR_API, "fabrics", self.fabric))
            self.kube.delete(path("v1", "namespaces", self.system_namespace))

    def __enter__(self) -> Suite:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- setup --------------------------------------------------------------------------

    def _device_class(self) -> None:
        with contextlib.suppress(Conflict):
            self.kube.create(
                path(RESOURCE, "deviceclasses"),
                {
                    "metadata": {"name": names.DEVICE_CLASS},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{names.DRIVER}"'}}]
                    },
                },
            )

    def _fabric_objects(self) -> None:
        import base64

        def b64(s: str) -> str:
            return base64.b64encode(s.encode()).decode()

        self.kube.create(
            path("v1", "secrets", namespace=self.system_namespace),
            {
                "metadata": {"name": "fabric-credentials"},
                "data": {
                    "username": b64(self.emulator.user),
                    "password": b64(self.emulator.password),
                    **(
                        {"client_id": b64(fsas.client_id), "client_secret": b64(fsas.client_secret)}
                        if (fsas := self.opts.fsas)
                        else {}
                    ),
                },
            },
        )
        self.kube.create(
            path(CR_API, "fabrics"),
            {
                "apiVersion": CR_API,
                "kind": "Fabric",
                "metadata": {"name": self.fabric},
                "spec": {
                    **self._backend(),
                    "endpoint": self.emulator.url,
                    "credentialsSecret": {
                        "name": "fabric-credentials",
                        "namespace": self.system_namespace,
                    },
                    "pollIntervalSeconds": self.opts.poll_interval_seconds,
                    "operationTimeoutSeconds": max(10, int(self.opts.attach_timeout)),
                },
            },
        )

    def _backend(self) -> JSON:
        """The Fabric's backend fields: Redfish, or the Fsas FM (SuiteOptions.fsas)."""
        fsas = self.opts.fsas
        if fsas is None:
            return {"backend": "redfish-composition"}
        settings: JSON = {"tenantUUID": fsas.tenant, "realm": fsas.realm}
        if fsas.attach_by_model:
            raw = self.opts.topology
            topology = emulator_topology.parse(raw) if raw else emulator_topology.default()
            models = sorted({b.model for b in topology.blocks.values()})
            settings |= {"attachBy": "model", "models": models}
        return {"backend": "fsas-fm", "fsas": settings}

    def add_node(self, host: str) -> SuiteNode:
        name = f"{host}-{self.suffix}"
        create_node(self.kube.api, name, system_uuid=host_uuid(host))
        root = self.workdir / name
        kubelet = KubeletEmulator(self.kube, name, root / "kubelet", root / "cdi")
        kubelet.start()
        plugin = PluginProcess.beside(
            kubelet, name, self.kubeconfig, root / "plugin", self._plugin_args(root)
        )
        plugin.start()
        node = SuiteNode(name, host, kubelet, plugin)
        self.nodes[host] = node
        return node

    def _plugin_args(self, root: Path) -> list[str]:
        """The plugin's flags for the redfish device source on this suite's emulator."""
        creds = root / "redfish-credentials.yaml"
        root.mkdir(parents=True, exist_ok=True)
        creds.write_text(
            yaml.safe_dump({"username": self.emulator.user, "password": self.emulator.password})
        )
        os.chmod(creds, 0o600)
        return [
            "--device-source=redfish",
            f"--redfish-endpoint={self.emulator.url}",
            f"--redfish-credentials-file={creds}",
            f"--poll-interval={self.opts.plugin_poll}",
            "--no-fsync",
        ]

    def add_real_node(self, host: str) -> RealNode:
        """A real node on ``host``: its kubelet registers the Node with the host's
        systemUUID; its plugin runs once the kubelet is up and is registered on return."""
        if self.control_plane is None or self.opts.node_bin_dir is None:
            raise ValueError("real nodes need Suite(control_plane=...) and node_bin_dir")
        name = f"{host}-{self.suffix}"
        root = self.workdir / f"r-{host}"  # short: unix socket paths are limited
        node = RealNode(
            name,
            self.opts.node_bin_dir,
            self.control_plane,
            root / "n",
            plugin_args=self._plugin_args(root),
            system_uuid=host_uuid(host),
        )
        self.real_nodes[host] = node
        node.start()
        node.start_plugin()
        return node

    def wait_registered(self, n: SuiteNode) -> None:
        wait_for(
            lambda: n.kubelet.registered_drivers().get(names.DRIVER) == "v1",
            60,
            f"the plugin of {n.name} to register",
            describe=n.plugin.log_tail,
        )

    # -- workload -----------------------------------------------------------------------

    def create_claim(self, namespace: str, name: str, local_first: bool = True) -> JSON:
        """A claim for one GPU: a local one if the node has one free, else from the pool."""
        return self.kube.create(
            path(RESOURCE, "resourceclaims", namespace=namespace), claim_body(name, local_first)
        )

    def create_pod(
        self,
        namespace: str,
        name: str,
        *,
        claim: str | None = None,
        node: str | None = None,
        run_seconds: float | None = None,
        local_first: bool = True,
        own_nodes: bool = True,
    ) -> JSON:
        """A pod with its own claim (named like the pod unless given), on this suite's nodes
        unless ``own_nodes`` is False (nodes a bench made itself)."""
        claim_name = claim or name
        if claim is None:
            self.create_claim(namespace, claim_name, local_first)
        pod = pod_body(name, claim_name, node=node or None, image=PAUSE_IMAGE)
        if own_nodes:
            pod = self.on_own_nodes(pod)
        pod["spec"]["terminationGracePeriodSeconds"] = 0
        if run_seconds is not None:
            pod["metadata"]["annotations"] = {RUN_SECONDS_ANNOTATION: str(run_seconds)}
        real = next((r for r in self.real_nodes.values() if r.name == node), None)
        if real is not None:
            # A real container: it prints its environment (the CDI edits) and waits.
            pod = for_real_node(pod, real.name, real.image)
            pod["spec"]["containers"][0]["command"] = ["sh", "-c", "env; exec sleep 3600"]
        return self.kube.create(path("v1", "pods", namespace=namespace), pod)

    def apply_example(self, name: str, namespace: str, host: str) -> list[str]:
        """Create an example of deploy/examples with its pods on ``host``'s node (made to
        run there when it is a real node); the pods' names."""
        node = self.node_of(host)
        real = self.real_nodes.get(host)
        pods = []
        for obj in examples.load(name):
            if obj["kind"] == "DeviceClass":
                continue  # the suite's own, of the same name
            if obj["kind"] == "Pod":
                pod = (
                    for_real_node(obj, node, real.image)
                    if real is not None
                    else {**obj, "spec": {**obj["spec"], "nodeSelector": {HOSTNAME: node}}}
                )
                self.kube.create(path("v1", "pods", namespace=namespace), pod)
                pods.append(obj["metadata"]["name"])
                continue
            plural = _CLAIM_PLURALS.get(obj["kind"])
            if plural is None:  # plugin-static: a DaemonSet of its own, not for the suite
                raise ValueError(f"example {name}: a {obj['kind']} has no place in the suite")
            self.kube.create(path(RESOURCE, plural, namespace=namespace), obj)
        return pods

    # -- observations -----------------------------------------------------------------

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

    def node_of(self, host: str) -> str:
        real = self.real_nodes.get(host)
        return real.name if real is not None else self.nodes[host].name

    def node_names(self) -> list[str]:
        """The names of this suite's nodes, emulated and real."""
        emulated = [n.name for n in self.nodes.values()]
        return sorted({*emulated, *(r.name for r in self.real_nodes.values())})

    def on_own_nodes(self, pod: JSON) -> JSON:
        """``pod`` kept to this suite's nodes: the control plane is shared by the tests of a
        session, and a node another test left behind (with its slices) must not take it."""
        term = {
            "matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": self.node_names()}]
        }
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
            }
        }
        return pod

    def host_of_node(self, node: str) -> str:
        every = {h: n.name for h, n in self.nodes.items()}
        every.update({h: r.name for h, r in self.real_nodes.items()})
        return next(h for h, n in every.items() if n == node)

    def describe(self) -> str:
        parts = []
        for c in self.components:
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
