"""A suite's nodes: kubelet emulators with their plugins, or real nodes, one per fabric host.

Each node carries the systemUUID of its fabric host, so that the operator and the pool
publisher map it to the emulator's host; its plugin reads the GPUs attached to that host
from the emulator (the redfish device source).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from composable_dra.k8s.kube import JSON, Kube
from composable_dra.model import names
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import host_uuid
from testbed import fake_nvml
from testbed.controlplane import ControlPlane
from testbed.kubelet_emulator import KubeletEmulator
from testbed.nodes import create_node, delete_node
from testbed.objects import HOSTNAME
from testbed.plugin_process import PluginProcess
from testbed.realnode import RealNode
from testbed.wait import wait_for


@dataclass
class SuiteNode:
    name: str
    host: str
    kubelet: KubeletEmulator
    plugin: PluginProcess


@dataclass(frozen=True)
class NodeSettings:
    """What every node of one suite shares."""

    kube: Kube
    kubeconfig: Path
    workdir: Path
    suffix: str  # makes node names unique on a control plane shared by a session's tests
    plugin_poll: float
    control_plane: ControlPlane | None = None
    node_bin_dir: Path | None = None
    fake_nvml_hosts: tuple[str, ...] = ()  # SuiteOptions'
    skip_release_hosts: tuple[str, ...] = ()
    nvml_health_hosts: tuple[str, ...] = ()
    extra_plugin_args: tuple[str, ...] = ()  # SuiteOptions.plugin_args: every plugin's
    kubelet_config: tuple[tuple[str, Any], ...] = ()  # SuiteOptions': the real kubelets'


class SuiteNodes:
    """The nodes of one suite, by fabric host: it starts, finds and stops them."""

    def __init__(self, settings: NodeSettings, emulator: EmulatorProcess) -> None:
        self.settings = settings
        self.emulator = emulator
        self.emulated: dict[str, SuiteNode] = {}  # host id -> node
        self.real: dict[str, RealNode] = {}  # host id -> real node

    def add(self, host: str) -> SuiteNode:
        s = self.settings
        name = f"{host}-{s.suffix}"
        create_node(s.kube.api, name, system_uuid=host_uuid(host))
        root = s.workdir / name
        kubelet = KubeletEmulator(s.kube, name, root / "kubelet", root / "cdi")
        kubelet.start()
        args, env = self.plugin_setup(host, root)
        plugin = PluginProcess.beside(kubelet, name, s.kubeconfig, root / "plugin", args, env)
        plugin.start()
        node = SuiteNode(name, host, kubelet, plugin)
        self.emulated[host] = node
        return node

    def add_real(self, host: str) -> RealNode:
        """A real node on ``host``: its kubelet registers the Node with the host's
        systemUUID; its plugin runs once the kubelet is up and is registered on return."""
        s = self.settings
        if s.control_plane is None or s.node_bin_dir is None:
            raise ValueError("real nodes need Suite(control_plane=...) and node_bin_dir")
        root = s.workdir / f"r-{host}"  # short: unix socket paths are limited
        args, env = self.plugin_setup(host, root)
        node = RealNode(
            f"{host}-{s.suffix}",
            s.node_bin_dir,
            s.control_plane,
            root / "n",
            plugin_args=args,
            plugin_env=env,
            system_uuid=host_uuid(host),
            kubelet_overrides=dict(s.kubelet_config),
        )
        self.real[host] = node
        node.start()
        node.start_plugin()
        return node

    def plugin_setup(self, host: str, root: Path) -> tuple[list[str], dict[str, str]]:
        """The plugin's flags and environment on ``host``: the fake NVML for the hosts in
        ``fake_nvml_hosts``, else the redfish source; either way the host's release
        command on the emulator's host state (but for ``skip_release_hosts``), so that
        every detach of the suite is released first or shows as a surprise removal."""
        args, env = self.source_setup(host, root)
        return [*args, *self.settings.extra_plugin_args], env

    def source_setup(self, host: str, root: Path) -> tuple[list[str], dict[str, str]]:
        """The flags and environment of ``host``'s device source and release command."""
        state = self.emulator.host_state_dir
        if state is None:
            raise ValueError("the suite's emulator needs its host state directory")
        if host in self.settings.fake_nvml_hosts:
            return self.fake_nvml_args(host), fake_nvml.env(state, host)
        args = self.plugin_args(root)
        if host not in self.settings.skip_release_hosts:
            args += fake_nvml.release_args()
        if host in self.settings.nvml_health_hosts:
            return [*args, "--nvml-health"], fake_nvml.env(state, host)
        return args, fake_nvml.release_env(state, host)

    def plugin_args(self, root: Path) -> list[str]:
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
            f"--poll-interval={self.settings.plugin_poll}",
            "--no-fsync",
        ]

    def fake_nvml_args(self, host: str) -> list[str]:
        """The plugin's flags for the fake NVML of ``host`` (testbed/fake_nvml), with its
        release command unless the host skips it."""
        release = host not in self.settings.skip_release_hosts
        return [*fake_nvml.plugin_args(self.settings.plugin_poll, release), "--no-fsync"]

    def wait_registered(self) -> None:
        """Until every emulated node's plugin has registered with its kubelet."""
        for n in self.emulated.values():
            wait_plugin_registered(n.kubelet, n.plugin, n.name)

    def stop(self) -> None:
        for n in self.emulated.values():
            n.plugin.stop()
            n.kubelet.stop()
            with contextlib.suppress(Exception):
                delete_node(self.settings.kube.api, n.name)
        for real in self.real.values():
            real.stop()  # its plugin too; deletes its Node

    def node_of(self, host: str) -> str:
        real = self.real.get(host)
        return real.name if real is not None else self.emulated[host].name

    def names(self) -> list[str]:
        """The names of this suite's nodes, emulated and real."""
        emulated = [n.name for n in self.emulated.values()]
        return sorted({*emulated, *(r.name for r in self.real.values())})

    def host_of(self, node: str) -> str:
        every = {h: n.name for h, n in self.emulated.items()}
        every.update({h: r.name for h, r in self.real.items()})
        return next(h for h, n in every.items() if n == node)

    def real_named(self, node: str | None) -> RealNode | None:
        return next((r for r in self.real.values() if r.name == node), None)


def wait_plugin_registered(
    kubelet: KubeletEmulator, plugin: PluginProcess, node: str, timeout: float = 60
) -> None:
    """Until ``plugin`` has registered our driver with the kubelet emulator of ``node``."""
    wait_for(
        lambda: kubelet.registered_drivers().get(names.DRIVER) == "v1",
        timeout,
        f"the plugin of {node} to register",
        describe=plugin.log_tail,
    )


def on_nodes(pod: JSON, nodes: list[str]) -> JSON:
    """``pod`` kept to ``nodes``: the control plane is shared by the tests of a session, and
    a node another test left behind (with its slices) must not take it."""
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": nodes}]}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    return pod
