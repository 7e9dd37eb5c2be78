"""A real node: containerd v2 and the upstream kubelet, with our kubelet plugin beside them.

containerd and the kubelet run in a mount and a network namespace of their own
(``unshare -m -n``). In the mount namespace the host paths that a node's pods name in
hostPath volumes are the node's own, bind-mounted from its work directory:
``/var/lib/kubelet`` (the kubelet's ``--root-dir``, so a DaemonSet's
``/var/lib/kubelet/plugins_registry`` is the directory this kubelet watches),
``/var/run/cdi`` (where containerd reads CDI specs), ``/var/lib/composable-dra`` (the
plugin's state), ``/var/lib/cni`` and ``/run/containerd``; every mount they make
vanishes with the namespace. The network namespace (``testbed.node_network``) has the
node's address, a bridge CNI network for its pods and a route to the API server, so pods
run in a pod network of their own, as in a cluster. Everything else lives under the
node's work directory (keep it short: unix socket paths are limited to 108 bytes). Our
plugin as a process runs in the host namespaces on the same directories, as a DaemonSet
pod with host paths would; the chart's plugin runs as a pod on the node. The binaries
come from ``hack/node/build.sh`` (``NODE_BIN_DIR``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from testbed import node_network, testimage
from testbed.controlplane import (
    BinaryProcess,
    ControlPlane,
    cached_build,
    exited,
    free_port,
    log_tails,
    start_or_report,
)
from testbed.plugin_process import PluginProcess
from testbed.wait import WaitTimeout, wait_for

NODE_BINARIES = (
    "kubelet",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "loopback",
    "bridge",
    "host-local",
    "portmap",
)
K8S_NAMESPACE = "k8s.io"  # containerd's namespace for CRI (kubelet) containers
# The bootstrap ClusterRole for kubelets; RBAC alone (no Node authorizer here) grants it
# to every node's credentials through this binding.
_NODE_BINDING = "composable-dra-local-nodes"


# The node's own copies of host directories (under its work directory's host/), by where
# they are bind-mounted in its mount namespace.
_PRIVATE_DIRS = {
    "var-log-containers": "/var/log/containers",
    "run-containerd": "/run/containerd",
    "var-lib-cni": "/var/lib/cni",
    "var-lib-composable-dra": "/var/lib/composable-dra",
}


class RealNodeError(RuntimeError):
    pass


def find_node_binaries(bin_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding the node binaries: NODE_BIN_DIR or hack/node/build.sh."""
    try:
        path = cached_build("NODE_BIN_DIR", "node/build.sh", NODE_BINARIES, bin_dir)
    except RuntimeError as exc:
        raise RealNodeError(f"node: {exc}") from exc
    if shutil.which("runc") is None:
        raise RealNodeError("runc is not on PATH (hack/node/build.sh installs it as root)")
    return path


def containerd_config(workdir: Path, bin_dir: Path, cdi_dir: Path, sandbox_image: str) -> str:
    """containerd's config (v3): its own directories and socket, CDI from the plugin's
    directory, runc through the v2 shim with cgroupfs, no NRI (its socket is host-wide),
    pod network namespaces pinned under its state directory (not the host's /run/netns)."""
    d = workdir / "containerd"
    return f"""\
version = 3
root = '{d / "root"}'
state = '{d / "state"}'
imports = []
disabled_plugins = ['io.containerd.nri.v1.nri']

[grpc]
  address = '{d / "containerd.sock"}'

[ttrpc]
  address = '{d / "containerd.sock.ttrpc"}'

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'

[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '{sandbox_image}'

[plugins.'io.containerd.cri.v1.runtime']
  # Without CAP_SYS_RESOURCE runc cannot lower its own oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  cdi_spec_dirs = ['{cdi_dir}']

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = '{workdir / "runc"}'

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['{bin_dir}']
  conf_dir = '{workdir / "cni"}'

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
"""


def kubelet_config(
    workdir: Path,
    ca_file: Path,
    port: int,
    healthz_port: int,
    address: str = "127.0.0.1",
    feature_gates: dict[str, bool] | None = None,
) -> dict[str, Any]:
    """The KubeletConfiguration for a machine with cgroup v1 and no CAP_SYS_RESOURCE;
    ``address``: where it serves (the node's address, for the API server's logs and exec);
    ``feature_gates``: the control plane's, which a cluster's kubelets share."""
    socket = f"unix://{workdir / 'containerd' / 'containerd.sock'}"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": socket,
        "imageServiceEndpoint": socket,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "failCgroupV1": False,
        "podLogsDir": str(workdir / "pod-logs"),
        # A shared test machine's disk is no reason to evict test pods or their image.
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "2s",
        "serializeImagePulls": False,
        **({"featureGates": dict(feature_gates)} if feature_gates else {}),
    }


def node_kubeconfig(
    cp: ControlPlane, node: str, path: Path, key_name: str = "node", server: str | None = None
) -> Path:
    """A kubeconfig at ``path`` with the node's own client certificate
    (``system:node:<node>``, group ``system:nodes``; ``<key_name>-<node>`` in the control
    plane's PKI directory): what its kubelet uses, and what the Node authorizer and
    NodeRestriction judge. ``server``: the API server's URL as the node reaches it (the
    control plane's own by default)."""
    assert cp.ca is not None
    pair = cp.ca.issue(
        f"{key_name}-{node}", f"system:node:{node}", organizations=("system:nodes",), client=True
    )
    _write_kubeconfig(path, server or cp.server, cp.ca.cert_path, pair.cert, pair.key)
    return path


def _write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {"name": "node", "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "node"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(body))
    path.chmod(0o600)


def ensure_node_binding(api: client.ApiClient) -> None:
    """Bind the bootstrap ``system:node`` ClusterRole to the ``system:nodes`` group."""
    body = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": _NODE_BINDING},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "system:node",
        },
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}
        ],
    }
    try:
        client.RbacAuthorizationV1Api(api).create_cluster_role_binding(body)
    except client.ApiException as exc:
        if exc.status != 409:
            raise


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _pids_in_mount_ns(ns: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _mount_ns(int(entry.name)) == ns:
            pids.append(int(entry.name))
    return pids


def _host_mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this process's mount namespace."""
    prefix = str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            found.append(target)
    return found


def metric_sample(port: int, name: str, **labels: str) -> float:
    """One sample of the Prometheus metrics served on ``port`` (0 when absent)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            wanted = all(sample.labels.get(k) == v for k, v in labels.items())
            if sample.name == name and wanted:
                return float(sample.value)
    return 0.0


@dataclass
class PluginInstance:
    """A further plugin process of one node and the port of its metrics."""

    process: PluginProcess
    metrics_port: int

    def metric(self, name: str, **labels: str) -> float:
        return metric_sample(self.metrics_port, name, **labels)


@dataclass
class RealNode:
    """One real node. Use as a context manager, or call start() and stop()."""

    name: str
    bin_dir: Path
    control_plane: ControlPlane
    workdir: Path
    plugin_args: list[str] = field(default_factory=list)
    plugin_env: dict[str, str] | None = None  # None: this process's environment
    start_timeout: float = 90.0
    image: str = testimage.IMAGE
    # The systemUUID the kubelet reports. Without DMI (this machine has no
    # /sys/class/dmi) the kubelet reports the machine ID, so the node's namespace gets
    # its own /etc/machine-id; None keeps the host's.
    system_uuid: str | None = None
    # More image archives to import into the node's containerd (the product's image).
    images: list[Path] = field(default_factory=list)
    # KubeletConfiguration fields that replace kubelet_config's (e.g. syncFrequency).
    kubelet_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()
        self.kubelet_root = self.workdir / "kubelet"
        self.plugins_registry_dir = self.kubelet_root / "plugins_registry"
        self.plugins_dir = self.kubelet_root / "plugins"
        self.cdi_dir = self.workdir / "cdi"
        self.pod_logs_dir = self.workdir / "pod-logs"
        self.logs_dir = self.workdir / "logs"
        self.socket = self.workdir / "containerd" / "containerd.sock"
        self._procs: list[BinaryProcess] = []
        self._holder: subprocess.Popen[bytes] | None = None
        self._ns: str | None = None
        self.plugin: PluginProcess | None = None
        self._registered = False  # the kubelet may have created the Node object
        self._kubelet_argv: list[str] = []
        self.plugin_metrics_port = 0
        # More instances of the plugin beside self.plugin (a rolling update's new pods).
        self.plugin_instances: list[PluginInstance] = []
        self.network: node_network.NodeAddresses | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        start_or_report(self._start, self.stop, self.logs_tail)

    def _start(self) -> None:
        cp = self.control_plane
        assert cp.ca is not None, "the control plane is not started"
        for d in (self.kubelet_root, self.cdi_dir, self.pod_logs_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        admin = cp.api_client()
        ensure_node_binding(admin)
        self._start_namespace()
        ctr_config, kubelet_yaml, kubeconfig = self._write_configs()
        assert self.network is not None
        self._spawn("containerd", [str(self.bin_dir / "containerd"), f"--config={ctr_config}"])
        wait_for(
            lambda: self.ctr("version", check=False).returncode == 0,
            self.start_timeout,
            f"containerd of {self.name} to answer",
            interval=0.2,
            describe=self.logs_tail,
        )
        archive = testimage.build(self.workdir / "image.tar", self.image)
        self.ctr("images", "import", str(archive))
        archive.unlink()
        for extra in self.images:
            self.import_image(extra)
        self._registered = True
        self._kubelet_argv = [
            str(self.bin_dir / "kubelet"),
            f"--config={kubelet_yaml}",
            f"--kubeconfig={kubeconfig}",
            # Its own directory, bind-mounted there: a plugin pod's socket paths under
            # it stay short (unix sockets: 108 bytes) and are the ones the pod names.
            "--root-dir=/var/lib/kubelet",
            f"--cert-dir={self.kubelet_root / 'pki'}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.network.node_ip}",
            "--v=2",
        ]
        self._spawn("kubelet", self._kubelet_argv)
        core = client.CoreV1Api(admin)
        wait_for(
            lambda: _ready(core.read_node(self.name)),
            self.start_timeout,
            f"node {self.name} to register and be Ready",
            interval=0.3,
            describe=self.logs_tail,
        )
        self.plugin_metrics_port = free_port()
        self.plugin = PluginProcess.beside(
            self,
            self.name,
            cp.kubeconfig,
            self.workdir / "plugin",
            [f"--metrics-port={self.plugin_metrics_port}", *self.plugin_args],
            self.plugin_env,
        )

    def _write_configs(self) -> tuple[Path, Path, Path]:
        """containerd's and the kubelet's configurations, the kubelet's kubeconfig and the
        node's CNI network, for the network the namespace was given."""
        cp = self.control_plane
        assert cp.ca is not None and self.network is not None
        cni = self.workdir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-pods.conflist").write_text(
            node_network.cni_conflist(self.network, self.workdir / "cni-ipam")
        )
        ctr_config = self.workdir / "containerd.toml"
        ctr_config.write_text(
            containerd_config(self.workdir, self.bin_dir, self.cdi_dir, self.image)
        )
        kubelet_yaml = self.workdir / "kubelet.yaml"
        body = kubelet_config(
            self.workdir,
            cp.ca.cert_path,
            free_port(),
            free_port(),
            self.network.node_ip,
            cp.feature_gates,
        )
        kubelet_yaml.write_text(yaml.safe_dump(overridden(body, self.kubelet_overrides)))
        # Through the kubernetes Service's address, as a node's pods reach it too.
        server = f"https://{node_network.API_SERVICE_IP}:{node_network.API_SERVICE_PORT}"
        kubeconfig = node_kubeconfig(
            cp, self.name, self.workdir / "kubelet.kubeconfig", server=server
        )
        return ctr_config, kubelet_yaml, kubeconfig

    def import_image(self, archive: Path) -> None:
        """Import an OCI or Docker archive into this node's containerd (CRI namespace),
        under the name its index gives it, as `ctr -n k8s.io images import` does."""
        self.ctr("images", "import", str(archive), timeout=300)

    def start_plugin(self, timeout: float = 30.0) -> PluginProcess:
        """Start our plugin for this node (after its static devices file is written) and
        wait until the kubelet has registered it.

        The plugin publishes its slices before the kubelet registers it; a pod bound in
        that gap fails to prepare ("driver is not registered") and the kubelet retries
        only after a long backoff (over a minute here), so tests wait for registration,
        as a cluster whose plugin DaemonSet is up does.
        """
        plugin = self.plugin
        assert plugin is not None, "the node is not started"
        plugin.start()

        self.wait_plugin_registered(1, timeout)
        return plugin

    def wait_plugin_registered(self, times: int, timeout: float = 30.0) -> None:
        """Wait until the kubelet has registered the running plugin ``times`` times (once
        per kubelet start since the plugin started)."""
        plugin = self.plugin
        assert plugin is not None, "the node is not started"

        def registered() -> bool:
            self.check_alive()
            if not plugin.alive():
                raise RealNodeError(f"the plugin of {self.name} exited\n{plugin.log_tail()}")
            return self.plugin_events("registered with the kubelet") >= times

        wait_for(
            registered,
            timeout,
            f"the kubelet of {self.name} to register the plugin ({times}x)",
            interval=0.1,
            describe=self.logs_tail,
        )

    def plugin_events(self, event: str) -> int:
        """How often the running plugin logged ``event``."""
        assert self.plugin is not None, "the node is not started"
        events = self.plugin.process.log_events(current_only=True)
        return sum(1 for e in events if e.get("event") == event)

    def plugin_metric(self, name: str, **labels: str) -> float:
        """One sample of the running plugin's Prometheus metrics (0 when absent)."""
        return metric_sample(self.plugin_metrics_port, name, **labels)

    def start_plugin_instance(self, uid: str, timeout: float = 30.0) -> PluginInstance:
        """Another instance of the plugin, as a DaemonSet rolling update's new pod starts
        beside the old one: the same checkpoint, CDI directory and devices as
        ``self.plugin``, sockets named with ``uid``, its own log and metrics port. Returns
        once the kubelet has registered it; ``stop()`` stops it with the node."""
        first = self.plugin
        assert first is not None, "the node is not started"
        port = free_port()
        process = PluginProcess.beside(
            self,
            self.name,
            self.control_plane.kubeconfig,
            self.workdir / f"plugin-{len(self.plugin_instances) + 2}",
            [
                *self.plugin_args,
                # Shared with the first instance, as the hostPath volumes share them.
                f"--state-dir={first.state_dir}",
                f"--static-file={first.static_file}",
                f"--boot-id-file={first.boot_id_file}",
                f"--metrics-port={port}",
                f"--rolling-update-uid={uid}",
            ],
            self.plugin_env,
        )
        instance = PluginInstance(process, port)
        self.plugin_instances.append(instance)
        process.start()

        def registered() -> bool:
            self.check_alive()
            if not process.alive():
                raise RealNodeError(f"plugin instance {uid} exited\n{process.log_tail()}")
            return process.logged("registered with the kubelet")

        wait_for(
            registered,
            timeout,
            f"the kubelet of {self.name} to register plugin instance {uid}",
            interval=0.1,
            describe=lambda: f"{self.logs_tail()}\n{process.log_tail()}",
        )
        return instance

    def restart_kubelet(self) -> None:
        """Stop the kubelet (SIGTERM) and start it again with the same flags, as a
        kubelet upgrade or crash does; containerd and the containers keep running."""
        assert self._kubelet_argv, "the node is not started"
        self._stop_proc("kubelet")
        self._procs = [p for p in self._procs if p.name != "kubelet"]
        self._spawn("kubelet", self._kubelet_argv)

    def stop(self) -> None:
        """Stop everything this node started and delete its work directory.

        Containers first (their shims outlive containerd), then the kubelet, containerd
        and the namespace; the namespace's mounts go with it.
        """
        if self.plugin is not None:
            self.plugin.stop()
        for instance in self.plugin_instances:
            instance.process.stop()
        self._stop_proc("kubelet")
        containerd = self._proc("containerd")
        if containerd is not None and containerd.popen.poll() is None:
            self._remove_containers()
        self._stop_proc("containerd")
        self._procs.clear()
        self._sweep_runc()
        if self._ns is not None:
            holder_pid = self._holder.pid if self._holder is not None else -1
            for pid in _pids_in_mount_ns(self._ns):
                if pid != holder_pid:  # shims left behind by a crash: ours, by pid
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        if self._holder is not None:
            self._holder.kill()
            self._holder.wait(10)
            self._holder = None
        if self._ns is not None:
            ns = self._ns
            wait_for(lambda: not _pids_in_mount_ns(ns), 10, "the node's mount namespace to empty")
            self._ns = None
        leftover = _host_mounts_under(self.workdir)
        if leftover:
            raise RealNodeError(f"mounts left under {self.workdir}: {leftover}")
        if os.environ.get("KEEP_NODE_DIR") is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._registered:
            # Its ResourceSlices are owned by the Node and go with it.
            admin = self.control_plane.api_client()
            with contextlib.suppress(client.ApiException):
                client.CoreV1Api(admin).delete_node(self.name)
            self._registered = False
        atexit.unregister(self.stop)

    # -- containers --------------------------------------------------------------------

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd (CRI namespace), in its namespace."""
        out = subprocess.run(
            [
                *self._nsenter(),
                str(self.bin_dir / "ctr"),
                f"--address={self.socket}",
                f"--namespace={K8S_NAMESPACE}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and out.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)} failed: {out.stderr.strip()}")
        return out

    def in_namespace(self, argv: list[str], timeout: float = 30) -> str:
        """Run ``argv`` in the node's mount and network namespaces; its output, or
        RealNodeError when it fails."""
        out = subprocess.run(
            [*self._nsenter(), *argv], capture_output=True, text=True, timeout=timeout, check=False
        )
        if out.returncode != 0:
            raise RealNodeError(f"{' '.join(argv)} on {self.name}: {out.stderr.strip()}")
        return out.stdout

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """The container's output from the kubelet's log file (CRI format stripped)."""
        files = sorted(self.pod_logs_dir.glob(f"{namespace}_{pod}_*/{container}/*.log"))
        lines = []
        for f in files:
            for line in f.read_text(errors="replace").splitlines():
                parts = line.split(" ", 3)  # time, stream, P/F tag, message
                lines.append(parts[3] if len(parts) == 4 else "")
        return "\n".join(lines)

    def _remove_containers(self) -> None:
        tasks = self.ctr("tasks", "ls", "--quiet", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "delete", "--force", task, check=False)
        containers = self.ctr("containers", "ls", "--quiet", check=False).stdout.split()
        if containers:
            self.ctr("containers", "delete", *containers, check=False)

    def _sweep_runc(self) -> None:
        """Containers that outlived containerd (a crash): killed and deleted through runc."""
        root = self.workdir / "runc" / K8S_NAMESPACE
        if not root.is_dir():
            return
        runc = ["runc", f"--root={root}"]
        ids = subprocess.run(
            [*runc, "list", "--quiet"], capture_output=True, text=True, check=False
        )
        for cid in ids.stdout.split():
            subprocess.run([*runc, "delete", "--force", cid], capture_output=True, check=False)

    # -- processes ---------------------------------------------------------------------

    def _start_namespace(self) -> None:
        """A sleeping process that holds the node's mount and network namespaces, with
        its bind mounts and its network (testbed.node_network)."""
        # Host paths the kubelet, the shims and the CNI plugins use whatever their flags
        # say, and those a DaemonSet's hostPath volumes name; the empty mount points stay
        # behind on the host.
        private = self.workdir / "host"
        for d in _PRIVATE_DIRS:
            (private / d).mkdir(parents=True, exist_ok=True)
        ready = self.workdir / "namespace-ready"
        machine_id = ""
        if self.system_uuid is not None:
            # Checked: it is written into a file that the kubelet reads as an ID.
            (private / "machine-id").write_text(f"{uuid.UUID(self.system_uuid)}\n")
            for target in ("/etc/machine-id", "/var/lib/dbus/machine-id"):
                if Path(target).is_file():
                    machine_id += f'mount --bind "$1/machine-id" {target}; '
        binds = {
            **{target: f'"$1/{d}"' for d, target in _PRIVATE_DIRS.items()},
            "/var/lib/kubelet": f"'{self.kubelet_root}'",
            "/var/run/cdi": f"'{self.cdi_dir}'",
        }
        # The kubelet's root a shared mount already: else the kubelet bind-mounts it over
        # itself at start, while another of its goroutines renames its pods-API socket
        # there (v1.37), and a rename across the two mounts fails (EXDEV), leaving the node
        # unregistered.
        script = (
            f"set -e; mkdir -p {' '.join(binds)}; "
            + "".join(f"mount --bind {src} {target}; " for target, src in binds.items())
            + "mount --make-rshared /var/lib/kubelet; "
            + f'{machine_id}touch "$2"; exec sleep infinity'
        )
        log = self.logs_dir / "namespace.log"
        with log.open("ab") as out:
            self._holder = subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--net",
                    "--propagation=private",
                    "--",
                    "sh",
                    "-c",
                    script,
                    "sh",
                    str(private),
                    str(ready),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        holder = self._holder

        def up() -> bool:
            if holder.poll() is not None:
                raise RealNodeError(f"unshare exited {holder.returncode}: {log.read_text()}")
            return ready.exists()

        try:
            wait_for(up, 20, f"the mount namespace of {self.name}", interval=0.05)
        except WaitTimeout as exc:
            raise RealNodeError(str(exc)) from exc.__cause__
        self._ns = _mount_ns(holder.pid)
        try:
            self.network = node_network.attach(holder.pid, self.control_plane.api_port)
        except node_network.NodeNetworkError as exc:
            raise RealNodeError(f"the network of {self.name}: {exc}") from exc

    def _nsenter(self) -> list[str]:
        assert self._holder is not None, "the node's namespace is not up"
        ns = f"/proc/{self._holder.pid}/ns"
        return ["nsenter", f"--mount={ns}/mnt", f"--net={ns}/net", "--"]

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = {**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        log = self.logs_dir / f"{name}.log"
        self._procs.append(BinaryProcess.spawn(name, [*self._nsenter(), *argv], log, env))

    def _proc(self, name: str) -> BinaryProcess | None:
        return next((p for p in self._procs if p.name == name), None)

    def _stop_proc(self, name: str) -> None:
        proc = self._proc(name)
        if proc is None:
            return
        proc.stop(20)

    def check_alive(self) -> None:
        names = exited(self._procs)
        if names:
            raise RealNodeError(f"node {self.name}: process exited: {names}\n{self.logs_tail()}")

    def logs_tail(self, lines: int = 30) -> str:
        parts = log_tails(self._procs, lines, f"{self.name}/")
        if self.plugin is not None and self.plugin.starts:
            parts.append(self.plugin.log_tail(lines))
        return "\n".join(parts)


def _ready(node: client.V1Node) -> bool:
    conditions = (node.status and node.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def overridden(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the fields of ``overrides`` in place of its own (a suite's
    ``kubelet_config``, e.g. a short syncFrequency)."""
    return config | overrides
