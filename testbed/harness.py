"""A test harness: the whole suite of components on a control plane, each a process of its own.

This module is the suite's lifecycle (start, in named steps, and stop); what a test reads
is testbed.cluster_view, what it creates testbed.workload, the nodes testbed.suite_nodes,
the objects and flags a suite starts with testbed.suite_setup.

Used by the end-to-end tests (tests/e2e/test_attach_flow.py), the demo and the
time-to-GPU benchmark::

    suite = Suite(kube, kubeconfig, workdir, SuiteOptions(...))
    suite.start()            # emulator, Fabric, nodes + kubelet emulators + plugins,
                             # operator, pool publisher, scaler; waits until ready
    suite.create_pod(namespace, "p1")
    ...
    suite.stop()

Nodes are fake (testbed.nodes, testbed.suite_nodes) with the systemUUID of a fabric host, so the
operator and the pool publisher map them to the emulator's hosts; each node's plugin
reads the GPUs attached to its host from the emulator (the redfish device source).
The hosts named in ``SuiteOptions.real_hosts`` run as real nodes instead
(testbed.realnode: the upstream kubelet, containerd, runc), whose kubelet
reports the host's systemUUID; their pods run real containers.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

from composable_dra.k8s.kube import Conflict, Kube, path
from composable_dra.model.device_classes import device_classes
from fabric_emulator.fsas.config import process_args
from fabric_emulator.testing import EmulatorProcess
from testbed import suite_setup
from testbed.cluster_view import CR_API
from testbed.controlplane import ControlPlane
from testbed.crds import install_crds
from testbed.objects import RESOURCE
from testbed.process import ComponentProcess
from testbed.suite_nodes import NodeSettings, SuiteNode, SuiteNodes
from testbed.suite_options import SuiteOptions
from testbed.wait import wait_for
from testbed.workload import PAUSE_IMAGE, Workload, claim_body

# Imported from here by the tests, the benches and the demo.
__all__ = ["CR_API", "PAUSE_IMAGE", "Suite", "SuiteNode", "SuiteOptions", "claim_body"]


class Suite(Workload):
    """One suite on a control plane: started, read (ClusterView), driven (Workload), stopped."""

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
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.opts = options or SuiteOptions()
        self.suffix = suffix or uuid.uuid4().hex[:5]
        self.system_namespace = f"cdra-{self.suffix}"
        emulator = EmulatorProcess(
            async_polls=self.opts.async_polls,
            retry_after=self.opts.retry_after,
            topology=self.opts.topology,
            workdir=workdir / "emulator",
            extra_args=process_args(workdir / "emulator", fsas) if (fsas := self.opts.fsas) else (),
            host_state_dir=workdir / "hosts",  # every suite: surprise removals are seen
        )
        settings = NodeSettings(
            kube,
            kubeconfig,
            workdir,
            self.suffix,
            self.opts.plugin_poll,
            control_plane,
            self.opts.node_bin_dir,
            self.opts.fake_nvml_hosts,
            self.opts.skip_release_hosts,
            self.opts.nvml_health_hosts,
            tuple(self.opts.plugin_args),
            tuple(self.opts.kubelet_config.items()),
        )
        hosts = SuiteNodes(settings, emulator)
        super().__init__(kube, f"fab-{self.suffix}", emulator, hosts, lambda: self.components)
        self.operator: ComponentProcess | None = None
        self.publisher: ComponentProcess | None = None
        self.scaler: ComponentProcess | None = None
        self.accepted_surprises: set[str] = set()  # blocks a test removed by force

    def start(self) -> Suite:
        """Start everything and wait until it is ready; on failure stop what started."""
        try:
            self._start_fabric()
            # The components first: their start-up (a process, imports, leader election,
            # the first reads) overlaps the nodes', which each wait for their kubelet.
            self._start_components()
            self._start_nodes()
            self._wait_ready()
            return self
        except BaseException:
            self.stop()
            raise

    def _start_fabric(self) -> None:
        """The CRDs, the DeviceClass, the emulator, and the Fabric with its credentials."""
        (self.workdir / "emulator").mkdir(parents=True, exist_ok=True)
        install_crds(self.kube)
        for device_class in device_classes():
            with contextlib.suppress(Conflict):
                self.kube.create(path(RESOURCE, "deviceclasses"), device_class)
        self.emulator.start(timeout=max(30.0, self.opts.start_timeout))
        if self.opts.attach_latency > 0:
            self.emulator.add_fault(suite_setup.attach_latency(self.opts.attach_latency))
        ns = self.system_namespace
        self.kube.create(path("v1", "namespaces"), {"metadata": {"name": ns}})
        self.kube.create(
            path("v1", "secrets", namespace=ns),
            suite_setup.credentials_secret(self.opts, self.emulator),
        )
        self.kube.create(
            path(CR_API, "fabrics"),
            suite_setup.fabric(self.fabric, self.opts, self.emulator.url, ns),
        )

    def _start_nodes(self) -> None:
        for host in self.opts.hosts:
            if host in self.opts.real_hosts:
                self.hosts.add_real(host)
            else:
                self.hosts.add(host)

    def _start_components(self) -> None:
        kubeconfig, ns, logs = str(self.kubeconfig), self.system_namespace, self.workdir / "logs"
        if self.opts.run_operator:
            self.operator = ComponentProcess(
                "operator", suite_setup.operator_args(self.opts, kubeconfig, ns), logs
            )
        self.publisher = ComponentProcess(
            "pool-publisher", suite_setup.publisher_args(self.opts, kubeconfig, ns), logs
        )
        self.scaler = ComponentProcess(
            "scaler", suite_setup.scaler_args(self.opts, kubeconfig, ns), logs
        )
        for c in self.components:
            c.start()

    def _wait_ready(self) -> None:
        """Until the plugins are registered, the pools published, the scaler leads and has
        made its first pass, and the operator has synced the Fabric."""
        self.hosts.wait_registered()
        timeout = self.opts.start_timeout
        wait_for(
            lambda: len(self.pool_slices()) >= 1,
            timeout,
            "the pool publisher to publish the fabric's pools",
            describe=self.describe,
        )
        lease = path(
            "coordination.k8s.io/v1",
            "leases",
            "composable-dra-scaler",
            namespace=self.system_namespace,
        )
        wait_for(
            lambda: self.kube.get_or_none(lease),
            timeout,
            "the scaler's lease",
            describe=self.describe,
        )
        # Its caches synced: a claim allocated now is the scaler's at once (the
        # benchmarks time the scaler's share from the allocation).
        scaler = self.scaler
        assert scaler is not None
        wait_for(
            lambda: any(
                e.get("event") == "first pass done" for e in scaler.log_events(current_only=True)
            ),
            timeout,
            "the scaler's first pass",
            describe=self.describe,
        )
        if self.operator is not None:
            # The operator's Fabric daemon has run once: kopf is up and handling.
            wait_for(
                lambda: (
                    self.kube.get(path(CR_API, "fabrics", self.fabric)).get("status") or {}
                ).get("lastSyncTime"),
                timeout,
                "the operator to sync the Fabric",
                describe=self.describe,
            )

    def unexpected_surprise_removals(self) -> list[dict[str, str]]:
        """Blocks the fabric removed while their host still held them (the emulator's
        record, fabric_emulator/host_bus.py), but for those in ``accepted_surprises`` (a
        test that forces one). Empty where the emulator does not track hosts."""
        return [
            s
            for s in self.emulator.surprise_removals()
            if s.get("block") not in self.accepted_surprises
        ]

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
        self.hosts.stop()
        self.emulator.close()
        with contextlib.suppress(Exception):
            self.kube.delete(path(CR_API, "fabrics", self.fabric))
            self.kube.delete(path("v1", "namespaces", self.system_namespace))

    def __enter__(self) -> Suite:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
