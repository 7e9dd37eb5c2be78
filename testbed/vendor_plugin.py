"""The vendor-like kubelet plugin (hack/vendor-plugin, Go) beside a real node's kubelet
(testbed.realnode), and a stand-in for its DaemonSet, for the vendor-driver
mode's end-to-end test.

``VendorPluginSet`` keeps, per node, the plugin process and a Pod that stands for it
(NVIDIA's kubelet plugin pod labels, bound to the node, running the test image and
waiting).
When that Pod is deleted, as the scaler does to restart a plugin that does
not see hot-plug, the set restarts the process and creates the Pod again, as the
DaemonSet controller and the kubelet would.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Conflict, Kube, path
from testbed.controlplane import cached_build
from testbed.process import ComponentProcess
from testbed.realnode_pods import for_real_node

# NVIDIA's driver, DeviceClass, namespace and kubelet plugin pod labels, as its chart
# (kubernetes-sigs/dra-driver-nvidia-gpu, v0.4.0 on) and upgrade guide set them: the
# plugin stands in for it under its real names, so the vendor-mode example is tested.
DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
NAMESPACE = "nvidia-dra-driver-gpu"  # the upgrade guide's release and namespace
LABELS = {
    "app.kubernetes.io/name": "dra-driver-nvidia-gpu",  # the chart's name
    "app.kubernetes.io/instance": NAMESPACE,  # the release's name
    "dra-driver-nvidia-gpu-component": "kubelet-plugin",  # tells the chart's components apart
}
SELECTOR = (
    "app.kubernetes.io/name=dra-driver-nvidia-gpu,dra-driver-nvidia-gpu-component=kubelet-plugin"
)
BINARY = "vendor-plugin"
# klog's level at which the upstream helper logs each gRPC call (its GRPCVerbosity
# default): the kubelet's NotifyRegistrationStatus then shows in the plugin's log.
GRPC_LOG_LEVEL = 6
_REGISTERED = "/pluginregistration.Registration/NotifyRegistrationStatus"


def find_vendor_plugin(bin_dir: str | None = None) -> Path:
    """The plugin binary: VENDOR_PLUGIN_DIR, or hack/vendor-plugin/build.sh (builds it when
    missing, cached by version; fails rather than skips)."""
    return cached_build("VENDOR_PLUGIN_DIR", "vendor-plugin/build.sh", [BINARY], bin_dir) / BINARY


def device_class() -> dict[str, object]:
    """NVIDIA's DeviceClass for whole GPUs, as its chart writes it: by driver and type."""
    expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'"
    return {
        "metadata": {"name": DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": expr}}]},
    }


@dataclass
class VendorPlugin:
    """One node's plugin process."""

    binary: Path
    node: str
    kubeconfig: Path
    registry_dir: Path
    plugins_dir: Path
    cdi_dir: Path
    redfish_endpoint: str
    credentials: tuple[str, str]
    workdir: Path

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        creds = self.workdir / "redfish-credentials.json"
        user, password = self.credentials
        creds.write_text(json.dumps({"username": user, "password": password}))
        os.chmod(creds, 0o600)
        args = [
            f"--node-name={self.node}",
            f"--kubeconfig={self.kubeconfig}",
            f"--driver-name={DRIVER}",
            f"--plugins-registry-dir={self.registry_dir}",
            f"--plugins-dir={self.plugins_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--redfish-endpoint={self.redfish_endpoint}",
            f"--redfish-credentials-file={creds}",
            f"-v={GRPC_LOG_LEVEL}",
        ]
        self.process = ComponentProcess(BINARY, args, self.workdir, binary=self.binary)

    @property
    def starts(self) -> int:
        return self.process.starts

    def start(self) -> None:
        self.process.start()

    def stop(self) -> None:
        self.process.stop()

    def restart(self) -> None:
        """The hook a restart goes through (a pod deletion in a real cluster)."""
        self.process.stop()
        self.process.start()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines)

    def registered(self) -> bool:
        """The kubelet has registered the running process (its registration call, which
        the helper logs at GRPC_LOG_LEVEL, succeeded)."""
        try:
            text = self.process.log_path.read_text(errors="replace")
        except OSError:
            return False
        return any(
            _REGISTERED in line and "handling request succeeded" in line
            for line in text.splitlines()
        )


@dataclass
class VendorPluginSet:
    """The plugins of some nodes, restarted when their Pod is deleted (a DaemonSet's job)."""

    kube: Kube
    namespace: str
    image: str  # the stand-in pods' (the real nodes' test image)
    plugins: dict[str, VendorPlugin] = field(default_factory=dict)  # node -> plugin

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._uids: dict[str, str] = {}  # node -> uid of its live pod ("" while replaced)
        self._informer = Informer(
            self.kube,
            path("v1", "pods", namespace=self.namespace),
            self._pods_changed,
            name="vendor-plugin-pods",
            labelSelector=SELECTOR,
        )

    def start(self) -> None:
        for node, plugin in self.plugins.items():
            plugin.start()
            self._create_pod(node)
        self._informer.start()

    def stop(self) -> None:
        self._informer.stop()
        for plugin in self.plugins.values():
            plugin.stop()

    def restarts(self, node: str) -> int:
        return self.plugins[node].starts - 1

    def _pod_name(self, node: str) -> str:
        return f"vendor-plugin-{node}"[:63]

    def _create_pod(self, node: str) -> None:
        # A real container that only waits: the process beside it is the plugin.
        container = {
            "name": "plugin",
            "image": self.image,
            "command": ["sh", "-c", "exec sleep 3600"],
        }
        body: JSON = {
            "metadata": {"name": self._pod_name(node), "labels": dict(LABELS)},
            "spec": {"nodeName": node, "containers": [container]},
        }
        body = for_real_node(body, node, self.image)
        try:
            created = self.kube.create(path("v1", "pods", namespace=self.namespace), body)
        except Conflict:
            return  # the old one is still finalizing: its DELETED event comes next
        self._uids[node] = str(created["metadata"]["uid"])

    def _pods_changed(self) -> None:
        if not self._informer.synced.is_set():
            return
        pods = {p["metadata"]["name"]: p for p in self._informer.items()}
        with self._lock:
            for node, plugin in self.plugins.items():
                pod = pods.get(self._pod_name(node))
                if pod is not None and not pod["metadata"].get("deletionTimestamp"):
                    continue
                if self._uids.get(node):
                    # Our pod is going: restart once, however many events its end takes.
                    self._uids[node] = ""
                    plugin.restart()
                if pod is None:
                    self._create_pod(node)
