"""Vendor-driver mode end to end (issue 17), on real nodes: a DRA driver that is not ours
beside the upstream kubelet, containerd and runc.

The vendor's plugin is hack/vendor-plugin (Go, on the upstream kubeletplugin helper),
built through the Go module proxy when missing; it registers with the real kubelet's
plugin registration socket and enumerates its node's GPUs once at start, as NVIDIA's
does. The Fabric's vendorDriver makes the pool publisher publish the pool under that
driver; a pod asking the vendor's DeviceClass gets a pool device, the operator attaches
it to the real node's host, the scaler restarts the vendor plugin (deleting its pod in
the vendor's namespace, the only one it may delete pods in; the test's stand-in
DaemonSet starts it again), waits until the vendor's slice lists the GPU, and sets
FabricDeviceReschedule; the scheduler places the pod again, on the vendor's local
device, and the kubelet has the Go plugin prepare it: the container's own output shows
the GPU's UUID from the plugin's CDI spec. The one-cycle path is timed in the same run,
on the other real node, for docs/operations.md.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest

from composable_dra.k8s.kube import Conflict, path
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from testbed import vendor_plugin
from testbed.harness import CR_API, Suite
from testbed.objects import RESOURCE
from testbed.realnode import RealNode
from testbed.realnode_pods import for_real_node
from testbed.realnodes import describe_nodes, gpu_env, wait_output
from testbed.vendor_plugin import VendorPlugin, VendorPluginSet, find_vendor_plugin
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e
HOSTS = ("node-1", "node-2")


def vendor_claim(suite: Suite, ns: str, name: str) -> None:
    request = {"name": "gpu", "exactly": {"deviceClassName": vendor_plugin.DEVICE_CLASS}}
    suite.kube.create(
        path(RESOURCE, "resourceclaims", namespace=ns),
        {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}},
    )


def time_to_running(suite: Suite, ns: str, name: str, created: float, timeout: float) -> float:
    def running() -> bool:
        for real in suite.real_nodes.values():
            real.check_alive()
        return suite.running(ns, name)

    wait_for(
        running,
        timeout,
        f"pod {ns}/{name} to run",
        interval=0.05,
        describe=lambda: describe_nodes(suite) + f"\nclaim: {suite.claim(ns, name).get('status')}",
    )
    return time.monotonic() - created


def claim_events(suite: Suite, ns: str, name: str) -> list[str]:
    items = suite.kube.get(
        path("v1", "events", namespace=ns),
        fieldSelector=f"involvedObject.name={name},involvedObject.kind=ResourceClaim",
    )["items"]
    return [e["reason"] for e in items]


def vendor_uuids(suite: Suite, node: str) -> set[str]:
    """The GPU UUIDs in the vendor's slices of ``node``."""
    slices = suite.kube.get(
        path(RESOURCE, "resourceslices"),
        fieldSelector=f"spec.nodeName={node},spec.driver={vendor_plugin.DRIVER}",
    )["items"]
    return {
        normalize_uuid(d["attributes"]["uuid"]["string"])
        for s in slices
        for d in s["spec"].get("devices", [])
    }


def start_vendor_plugin(
    suite: Suite, real: RealNode, plugins_ns: str, binary: Path, workdir: Path
) -> VendorPluginSet:
    """The Go plugin beside ``real``'s kubelet, its stand-in pod in ``plugins_ns``; returns
    once the kubelet has registered it."""
    plugins = VendorPluginSet(suite.kube, plugins_ns, real.image)
    plugin = VendorPlugin(
        binary,
        real.name,
        suite.kubeconfig,
        real.plugins_registry_dir,
        real.plugins_dir,
        real.cdi_dir,
        suite.emulator.url,
        (suite.emulator.user, suite.emulator.password),
        workdir,
    )
    plugins.plugins[real.name] = plugin
    plugins.start()

    def registered() -> bool:
        real.check_alive()
        assert plugin.process.alive(), plugin.log_tail()
        return plugin.registered()

    wait_for(
        registered,
        60,
        f"the kubelet of {real.name} to register the vendor plugin",
        describe=lambda: f"{plugin.log_tail()}\n{real.logs_tail(10)}",
    )
    return plugins


def nvidia_controller_pod(suite: Suite, real: RealNode, ns: str) -> str:
    """A pod labelled as NVIDIA's chart labels its controller, on ``real``, in the plugin's
    namespace: the restart selector must leave it alone. Returns its UID."""
    labels = {**vendor_plugin.LABELS, "dra-driver-nvidia-gpu-component": "controller"}
    container = {
        "name": "controller",
        "image": real.image,
        "command": ["sh", "-c", "exec sleep 3600"],
    }
    body = {
        "metadata": {"name": "nvidia-controller", "labels": labels},
        "spec": {"nodeName": real.name, "containers": [container]},
    }
    created = suite.kube.create(
        path("v1", "pods", namespace=ns), for_real_node(body, real.name, real.image)
    )
    return str(created["metadata"]["uid"])


@pytest.fixture(scope="module")
def binary() -> Path:
    """The vendor plugin: built through the Go module proxy when missing (never skipped)."""
    return find_vendor_plugin()


# Long because it is one scenario read top to bottom; its steps share what it built.
@pytest.mark.versions("1.36")
def test_vendor_mode_reschedules_onto_the_vendors_local_device_on_a_real_node(
    make_suite: MakeSuite, namespace: str, short_tmp: Path, binary: Path
) -> None:
    plugins_ns = vendor_plugin.NAMESPACE
    suite = make_suite(
        hosts=HOSTS,
        real_hosts=HOSTS,
        no_removal=600.0,
        scaler_args=[f"--vendor-plugin-namespace={plugins_ns}"],
    )
    suite.kube.create(path("v1", "namespaces"), {"metadata": {"name": plugins_ns}})
    with contextlib.suppress(Conflict):
        suite.kube.create(path(RESOURCE, "deviceclasses"), vendor_plugin.device_class())
    real1, real2 = suite.real_nodes["node-1"], suite.real_nodes["node-2"]
    node1, node2 = real1.name, real2.name
    plugins = start_vendor_plugin(suite, real1, plugins_ns, binary, short_tmp / "vp")
    bystander = nvidia_controller_pod(suite, real1, plugins_ns)
    try:
        # 1. The one-cycle path (our plugin, FabricDeviceReady), timed, on node-2.
        t0 = time.monotonic()
        suite.create_pod(namespace, "one-cycle", node=node2, local_first=False)
        one_cycle = time_to_running(suite, namespace, "one-cycle", t0, 120)
        [one] = [r for r in suite.resources() if r["spec"]["targetNode"] == node2]
        one_env = gpu_env(suite, namespace, "one-cycle")  # the container's own output
        assert normalize_uuid(one_env["COMPOSABLE_GPU_UUIDS"]) == normalize_uuid(
            one["status"]["deviceUUID"]
        )
        suite.kube.delete(path("v1", "pods", "one-cycle", namespace=namespace))
        suite.kube.delete(path(RESOURCE, "resourceclaims", "one-cycle", namespace=namespace))
        wait_for(
            lambda: all(not r["spec"].get("claimRef") for r in suite.resources()),
            60,
            "the one-cycle GPU to be released",
            describe=suite.describe,
        )

        # 2. Vendor-driver mode on the Fabric: the pool moves to the vendor's driver.
        suite.kube.merge_patch(
            path(CR_API, "fabrics", suite.fabric),
            {
                "spec": {
                    "vendorDriver": {
                        "name": vendor_plugin.DRIVER,
                        "attributes": {"type": "gpu"},
                        "restart": {"namespace": plugins_ns, "podSelector": vendor_plugin.SELECTOR},
                    }
                }
            },
        )
        wait_for(
            lambda: {s["spec"]["driver"] for s in suite.pool_slices()} == {vendor_plugin.DRIVER},
            60,
            "the pool under the vendor's driver",
            describe=suite.describe,
        )
        assert vendor_uuids(suite, node1) == set()  # no GPU on node-1's host yet

        # 3. A pod asking the vendor's DeviceClass, on the real node-1.
        t0 = time.monotonic()
        vendor_claim(suite, namespace, "vendor")
        suite.create_pod(namespace, "vendor", claim="vendor", node=node1)
        vendor_path = time_to_running(suite, namespace, "vendor", t0, 180)

        claim = suite.claim(namespace, "vendor")
        [result] = claim["status"]["allocation"]["devices"]["results"]
        # Placed again on the vendor's local device (pool = node), no binding conditions.
        assert (result["driver"], result["pool"]) == (vendor_plugin.DRIVER, node1)
        assert not result.get("bindingConditions")
        assert names.FABRIC_DEVICE_RESCHEDULE in claim_events(suite, namespace, "vendor")
        assert plugins.restarts(node1) >= 1
        # NVIDIA's real selector restarted the kubelet plugin, not its namespace's other pods.
        kept = suite.kube.get(path("v1", "pods", "nvidia-controller", namespace=plugins_ns))
        assert kept["metadata"]["uid"] == bystander and not kept["metadata"].get(
            "deletionTimestamp"
        )
        [cr] = [r for r in suite.resources() if r["spec"]["targetNode"] == node1]
        assert cr["status"]["phase"] == "Online"
        gpu = normalize_uuid(cr["status"]["deviceUUID"])
        assert gpu in vendor_uuids(suite, node1)
        # The container's own output: what containerd injected from the Go plugin's CDI
        # spec for the device the real kubelet had it prepare.
        out = wait_output(real1, namespace, "vendor", "VENDOR_GPU_UUID=")
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        assert normalize_uuid(env["VENDOR_GPU_UUID"]) == gpu
        assert normalize_uuid(env["NVIDIA_VISIBLE_DEVICES"]) == gpu
        assert "COMPOSABLE_GPU_UUIDS" not in env  # not prepared by our plugin
        spec_file = real1.cdi_dir / f"vendor.example-{claim['metadata']['uid']}.json"
        assert spec_file.exists()
        print(
            f"\ntime to GPU on real nodes (pod created -> Running): one-cycle "
            f"{one_cycle:.1f}s, vendor reschedule path {vendor_path:.1f}s"
        )
        record = {"one_cycle_s": round(one_cycle, 2), "vendor_reschedule_s": round(vendor_path, 2)}
        (Path(suite.workdir) / "time_to_gpu.json").write_text(json.dumps(record))

        # 4. Deleting the pod: the real kubelet has the Go plugin unprepare the claim.
        suite.kube.delete(path("v1", "pods", "vendor", namespace=namespace))
        wait_for(
            lambda: not spec_file.exists(),
            60,
            "NodeUnprepareResources (the vendor's CDI spec removed) after the pod's deletion",
            describe=lambda: describe_nodes(suite) + plugins.plugins[node1].log_tail(),
        )
    finally:
        plugins.stop()
        with contextlib.suppress(Exception):
            suite.kube.delete(path("v1", "namespaces", plugins_ns))
