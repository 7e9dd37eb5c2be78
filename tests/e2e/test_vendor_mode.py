"""Vendor-driver mode end to end (issue 17): a DRA driver that is not ours on the node.

The vendor's plugin is hack/vendor-plugin (Go, on the upstream kubeletplugin helper),
built through the Go module proxy when missing; it enumerates its node's GPUs once at
start, as NVIDIA's does. The Fabric's vendorDriver makes the pool publisher publish the
pool under that driver; a pod asking the vendor's DeviceClass gets a pool device, the
operator attaches it, the scaler restarts the vendor plugin (deleting its pod; the test's
stand-in DaemonSet starts it again), waits until the vendor's slice lists the GPU, and
sets FabricDeviceReschedule; the scheduler places the pod again, on the vendor's local
device. The one-cycle path is timed in the same run for docs/operations.md.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest

from composable_dra import names
from composable_dra.kube import Conflict, path
from hack.localcluster import vendor_plugin
from hack.localcluster.harness import CR_API, RESOURCE, Suite
from hack.localcluster.vendor_plugin import VendorPlugin, VendorPluginSet, find_vendor_plugin
from hack.localcluster.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e


def vendor_claim(suite: Suite, ns: str, name: str) -> None:
    request = {"name": "gpu", "exactly": {"deviceClassName": vendor_plugin.DEVICE_CLASS}}
    suite.kube.create(
        path(RESOURCE, "resourceclaims", namespace=ns),
        {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}},
    )


def time_to_running(suite: Suite, ns: str, name: str, created: float, timeout: float) -> float:
    wait_for(
        lambda: suite.running(ns, name),
        timeout,
        f"pod {ns}/{name} to run",
        interval=0.05,
        describe=lambda: suite.describe() + f"\nclaim: {suite.claim(ns, name).get('status')}",
    )
    return time.monotonic() - created


def claim_events(suite: Suite, ns: str, name: str) -> list[str]:
    items = suite.kube.get(
        path("v1", "events", namespace=ns),
        fieldSelector=f"involvedObject.name={name},involvedObject.kind=ResourceClaim",
    )["items"]
    return [e["reason"] for e in items]


@pytest.fixture(scope="module")
def binary() -> Path:
    """The vendor plugin: built through the Go module proxy when missing (never skipped)."""
    return find_vendor_plugin()


def test_vendor_mode_reschedules_onto_the_vendors_local_device(
    make_suite: MakeSuite, namespace: str, short_tmp: Path, binary: Path
) -> None:
    suite = make_suite(hosts=("node-1", "node-2"), no_removal=600.0)
    with contextlib.suppress(Conflict):
        suite.kube.create(path(RESOURCE, "deviceclasses"), vendor_plugin.device_class())
    node1, node2 = suite.node_of("node-1"), suite.node_of("node-2")
    kubelet = suite.nodes["node-1"].kubelet
    plugins = VendorPluginSet(suite.kube, suite.system_namespace)
    plugins.plugins[node1] = VendorPlugin(
        binary,
        node1,
        suite.kubeconfig,
        kubelet.plugins_registry_dir,
        kubelet.plugins_dir,
        kubelet.cdi_dir,
        suite.emulator.url,
        (suite.emulator.user, suite.emulator.password),
        short_tmp / "vp",
    )
    plugins.start()
    try:
        wait_for(
            lambda: kubelet.registered_drivers().get(vendor_plugin.DRIVER) == "v1",
            60,
            "the vendor plugin to register",
            describe=plugins.plugins[node1].log_tail,
        )

        # 1. The one-cycle path (our plugin, FabricDeviceReady), timed, on node-2.
        t0 = time.monotonic()
        suite.create_pod(namespace, "one-cycle", node=node2, local_first=False)
        one_cycle = time_to_running(suite, namespace, "one-cycle", t0, 120)
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
                        "restart": {
                            "namespace": suite.system_namespace,
                            "podSelector": vendor_plugin.LABEL,
                        },
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
        vendor_local = suite.kube.get(
            path(RESOURCE, "resourceslices"),
            fieldSelector=f"spec.nodeName={node1},spec.driver={vendor_plugin.DRIVER}",
        )["items"]
        assert [d for s in vendor_local for d in s["spec"].get("devices", [])] == []

        # 3. A pod asking the vendor's DeviceClass.
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
        # The attached GPU is the one the vendor prepared (CDI env with its UUID).
        [cr] = [r for r in suite.resources() if r["spec"]["targetNode"] == node1]
        assert cr["status"]["phase"] == "Online"
        uuid = cr["status"]["deviceUUID"]
        pod_uid = suite.pod(namespace, "vendor")["metadata"]["uid"]
        prepared = kubelet.prepared_devices(pod_uid)
        [cdi_id] = prepared[claim["metadata"]["uid"]]
        assert cdi_id.startswith("vendor.example/gpu=")
        spec_file = kubelet.cdi_dir / f"vendor.example-{claim['metadata']['uid']}.json"
        env = json.loads(spec_file.read_text())["devices"][0]["containerEdits"]["env"]
        assert f"VENDOR_GPU_UUID={uuid}" in env
        print(
            f"\ntime to GPU (pod created -> Running): one-cycle {one_cycle:.1f}s, "
            f"vendor reschedule path {vendor_path:.1f}s"
        )
        record = {"one_cycle_s": round(one_cycle, 2), "vendor_reschedule_s": round(vendor_path, 2)}
        (Path(suite.workdir) / "time_to_gpu.json").write_text(json.dumps(record))
    finally:
        plugins.stop()
