"""A lending lab on a local control plane: donor nodes, consumer nodes and the scaler.

Each donor is a node (kubelet emulator) whose plugin lends its static GPUs (``--lend``)
and a ``remote-gpu-donor`` process with its lease API over HTTPS (a local CA); each
consumer is a node with no GPU and no fabric reach whose plugin fetches lease
credentials at prepare, proving its node with the token a pod of its own would hold
(``testbed/pod_token.py``: the harness plays the kubelet); the scaler runs the
lease controller. Every component is its own process. Used by
``hack/bench/remote_claims.py`` and the demo (``hack/demo.py``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from composable_dra.k8s.kube import Conflict, Kube, path
from composable_dra.lending.remote_leases import DonorDirectory, LeaseClient, TokenSource
from dra_driver.slices import NETWORK_DOMAIN_LABEL
from testbed import ControlPlane
from testbed.controlplane import free_port
from testbed.crds import install_crds
from testbed.kubelet_emulator import KubeletEmulator
from testbed.nodes import create_node, delete_node
from testbed.pki import CertificateAuthority, KeyPair
from testbed.plugin_process import PluginProcess, write_static_devices
from testbed.pod_token import PodToken
from testbed.process import ComponentProcess
from testbed.remote_pods import DEVICE_CLASS as CLASS
from testbed.remote_pods import DRIVER
from testbed.wait import wait_for

RESOURCE = "resource.k8s.io/v1"
CONTROLLER_SA, PLUGIN_SA = "lease-controller", "lend-plugin"


def donor_process(
    name: str,
    secret: Path,
    tls: KeyPair,
    ports: tuple[int, int],
    cp: ControlPlane,
    namespace: str,
    workdir: Path,
    extra: Sequence[str] = (),
    data_host: str = "127.0.0.1",
) -> ComponentProcess:
    """``remote-gpu-donor`` for node ``name``: ``matmul`` allowed over TCP on
    ``data_host:ports[0]``, its lease API over HTTPS on ``ports[1]`` for the lease
    controller's and the plugins' service accounts in ``namespace``."""
    data_port, api_port = ports
    return ComponentProcess(
        "remote-gpu-donor",
        [
            f"--name={name}",
            f"--node-name={name}",
            f"--secret-file={secret}",
            f"--listen={data_host}:{data_port}",
            "--transports=tcp",
            "--allow=matmul=remote_gpu.builtins:matmul",
            *extra,
            f"--lease-api-listen=127.0.0.1:{api_port}",
            f"--lease-api-cert={tls.cert}",
            f"--lease-api-key={tls.key}",
            f"--kubeconfig={cp.kubeconfig}",
            f"--lease-controller-sa={namespace}/{CONTROLLER_SA}",
            f"--lease-plugin-sa={namespace}/{PLUGIN_SA}",
        ],
        workdir,
    )


def donor_flags(apis: Mapping[str, str], ca: Path) -> list[str]:
    """A lease API caller's flags for the donors ``apis`` (node -> URL) under the CA ``ca``."""
    return [*(f"--donor-api={node}={url}" for node, url in apis.items()), f"--donor-ca-file={ca}"]


def plugin_token(
    cp: ControlPlane, kube: Kube, node: str, namespace: str, workdir: Path
) -> PodToken:
    """The projected token of a plugin pod on ``node`` (the plugins' service account in
    ``namespace``), under ``workdir``, kept fresh until ``stop``."""
    return PodToken(cp, kube, node, namespace, PLUGIN_SA, workdir / "lease-token" / "token")


def scaler_process(
    cp: ControlPlane, client_flags: Sequence[str], workdir: Path
) -> ComponentProcess:
    """The scaler for a lending lab: its lease controller lists the donors' leases each second."""
    return ComponentProcess(
        "scaler",
        [f"--kubeconfig={cp.kubeconfig}", "--no-leader-elect", "--lease-resync=1", *client_flags],
        workdir,
    )


@dataclass
class Donor:
    node: str
    plugin: PluginProcess
    kubelet: KubeletEmulator
    process: ComponentProcess
    api_url: str


@dataclass
class Consumer:
    node: str
    plugin: PluginProcess
    kubelet: KubeletEmulator


@dataclass
class Lab:
    """Donors, consumers and the scaler on one control plane."""

    kube: Kube
    cp: ControlPlane
    root: Path
    namespace: str = "lending"
    prefix: str = ""  # of the node names (donor-0, consumer-0, ...)
    domain: str = "lending-domain"
    donors: list[Donor] = field(default_factory=list)
    consumers: list[Consumer] = field(default_factory=list)
    procs: list[ComponentProcess] = field(default_factory=list)
    tokens: list[PodToken] = field(default_factory=list)  # the plugins' pod tokens
    # Donors' plugins read their donor's status this often (0: never; the lending policy).
    donor_status_interval: float = 0.0
    donor_args: list[str] = field(default_factory=list)  # more flags for each donor
    donor_plugin_args: list[str] = field(default_factory=list)  # and for its plugin
    data_host: str = "127.0.0.1"  # where the donors' data planes listen (a shaped link's end)

    def __post_init__(self) -> None:
        self.ca = CertificateAuthority(self.root / "pki")
        self.secret = self.root / "donor-secret"
        self.secret.write_bytes(os.urandom(32).hex().encode())

    def controller_flags(self) -> list[str]:
        return [
            f"--lease-service-account={self.namespace}/{CONTROLLER_SA}",
            *donor_flags({d.node: d.api_url for d in self.donors}, self.ca.cert_path),
        ]

    def plugin_flags(self, node: str, root: Path, apis: Mapping[str, str]) -> list[str]:
        """The lease flags of ``node``'s plugin: its pod's token, and the donors ``apis``."""
        token = plugin_token(self.cp, self.kube, node, self.namespace, root).start()
        self.tokens.append(token)
        return [f"--lease-token-file={token.file}", *donor_flags(apis, self.ca.cert_path)]

    def node(self, name: str) -> tuple[KubeletEmulator, Path]:
        create_node(self.kube.api, name, labels={NETWORK_DOMAIN_LABEL: self.domain})
        root = self.root / name
        kubelet = KubeletEmulator(self.kube, name, root / "kubelet", root / "cdi")
        kubelet.start()
        return kubelet, root

    def plugin(
        self, name: str, kubelet: KubeletEmulator, root: Path, args: list[str]
    ) -> PluginProcess:
        return PluginProcess.beside(kubelet, name, self.cp.kubeconfig, root / "plugin", args)

    def add_donor(self, i: int, gpus: int, max_leases: int) -> None:
        name = f"{self.prefix}donor-{i}"
        kubelet, root = self.node(name)
        api_port = free_port()
        status: list[str] = []
        if self.donor_status_interval > 0:  # its own donor's API, with its pod's token
            status = [
                *self.plugin_flags(name, root, {name: f"https://127.0.0.1:{api_port}"}),
                f"--donor-status-interval={self.donor_status_interval}",
            ]
        plugin = self.plugin(
            name,
            kubelet,
            root,
            [
                "--lend",
                "--link-gbps=100",
                f"--max-leases={max_leases}",
                *status,
                *self.donor_plugin_args,
            ],
        )
        write_static_devices(
            plugin.static_file,
            [
                {
                    "uuid": f"GPU-{name}-{g}",
                    "name": f"gpu-{g}",  # every donor's: the plugin keys them by pool
                    "model": "A100",
                    "memory": "80Gi",
                }
                for g in range(gpus)
            ],
        )
        plugin.start()
        tls = self.ca.issue(name, name, ips=("127.0.0.1",), server=True)
        process = donor_process(
            name,
            self.secret,
            tls,
            (free_port(), api_port),
            self.cp,
            self.namespace,
            root / "donor",
            [f"--memory-quota={16 << 20}", *self.donor_args],
            self.data_host,
        )
        process.start()
        self.donors.append(Donor(name, plugin, kubelet, process, f"https://127.0.0.1:{api_port}"))

    def start(self, donors: int, gpus: int, max_leases: int, consumers: int) -> None:
        """Donors, then the scaler (its lease controller), then consumers, all registered."""
        with contextlib.suppress(Conflict):
            self.kube.create(path("v1", "namespaces"), {"metadata": {"name": self.namespace}})
        for sa in (CONTROLLER_SA, PLUGIN_SA):
            self.kube.create(
                path("v1", "serviceaccounts", namespace=self.namespace), {"metadata": {"name": sa}}
            )
        with contextlib.suppress(Conflict):
            self.kube.create(
                path(RESOURCE, "deviceclasses"),
                {
                    "metadata": {"name": CLASS},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
                    },
                },
            )
        install_crds(self.kube)
        for i in range(donors):
            self.add_donor(i, gpus, max_leases)
        for d in self.donors:
            wait_for(
                lambda d=d: any(  # type: ignore[misc]
                    e.get("event") == "lease API listening" for e in d.process.log_events(True)
                ),
                60,
                f"the lease API of {d.node}",
                describe=d.process.log_tail,
            )
        scaler = scaler_process(self.cp, self.controller_flags(), self.root / "scaler")
        self.procs.append(scaler.start())
        for i in range(consumers):
            name = f"{self.prefix}consumer-{i}"
            kubelet, root = self.node(name)
            apis = {d.node: d.api_url for d in self.donors}
            plugin = self.plugin(name, kubelet, root, self.plugin_flags(name, root, apis))
            write_static_devices(plugin.static_file, [])  # no GPU, and no fabric reaches it
            plugin.start()
            self.consumers.append(Consumer(name, plugin, kubelet))
        for n in self.nodes():
            wait_for(
                lambda n=n: DRIVER in n.kubelet.registered_drivers(),  # type: ignore[misc]
                60,
                f"the plugin of {n.node} to register",
                describe=n.plugin.log_tail,
            )

    def open_leases(self) -> int:
        client = LeaseClient(
            DonorDirectory({d.node: d.api_url for d in self.donors}),
            TokenSource(self.kube, self.namespace, CONTROLLER_SA),
            str(self.ca.cert_path),
        )
        return sum(len(client.list(d.node).items) for d in self.donors)

    def token_files(self) -> int:
        """The lease tokens the consumers' plugins hold (one per lease directory)."""
        return sum(
            len(list((c.plugin.state_dir / "remote-gpu").rglob("token"))) for c in self.consumers
        )

    def nodes(self) -> list[Donor | Consumer]:
        return [*self.donors, *self.consumers]

    def describe(self) -> str:
        procs = [*self.procs, *(d.process for d in self.donors)]
        plugins = [n.plugin for n in self.nodes()]
        return "\n".join([*(p.log_tail(15) for p in procs), *(p.log_tail(15) for p in plugins)])

    def stop(self) -> None:
        for p in self.procs:
            p.stop()
        for t in self.tokens:
            t.stop()
        for n in self.nodes():
            n.kubelet.stop()
            n.plugin.stop()
        for d in self.donors:
            d.process.stop()
        # The control plane outlives the lab (a test session's is shared): its Nodes go, and
        # with them the slices they own, or later pods are scheduled onto them.
        for n in self.nodes():
            delete_node(self.kube.api, n.node)
