"""What a suite runs: its hosts, the fabric's behaviour, the components' flags and timeouts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric_emulator.fsas.config import FsasConfig


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
    plugin_args: list[str] = field(default_factory=list)  # every node's plugin, last
    # Hosts (of ``hosts``) that run as real nodes; they need Suite(control_plane=...)
    # and the node binaries (testbed.realnode.find_node_binaries).
    real_hosts: tuple[str, ...] = ()
    node_bin_dir: Path | None = None
    # KubeletConfiguration fields of the real nodes (testbed/realnode.py kubelet_config).
    kubelet_config: dict[str, Any] = field(default_factory=dict)
    # Seconds to wait for the first pools, the scaler's lease and the Fabric's first sync
    # (a large fabric's first inventory read takes longer).
    start_timeout: float = 60.0
    # The Fabric speaks the emulator's Fsas FM API (backend fsas-fm) with this config;
    # with attach_by_model the FM picks the GPU and the Fabric says attachBy model.
    fsas: FsasConfig | None = None
    # Hosts whose plugin reads its GPUs through the fake NVML (testbed/fake_nvml) over the
    # host state the emulator shares (the others: the redfish source). Every plugin
    # releases a GPU before a detach with the fake's release command on that state,
    # unless its host is in ``skip_release_hosts`` (a plugin that skips its release
    # step); the emulator records every suite's surprise removals
    # (fabric_emulator/host_bus.py), asked zero at teardown (tests/e2e/conftest.py).
    fake_nvml_hosts: tuple[str, ...] = ()
    # Hosts whose plugin keeps the redfish source but judges health by the fake NVML too
    # (``--nvml-health``): its GPUs' XIDs, ECC errors and loss, set in the host state.
    nvml_health_hosts: tuple[str, ...] = ()
    skip_release_hosts: tuple[str, ...] = ()
