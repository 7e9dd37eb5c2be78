"""The operator on the real control plane with the fabric emulator and the node plugin.

A ComposableResource is attached (the emulator's state shows it), the node's plugin sees
the device and says so, the resource becomes Online; deleting it detaches the device;
a device that a claim's allocation uses is not detached until the allocation ends.
"""

from __future__ import annotations

import base64
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import host_uuid
from testbed import ControlPlane
from testbed.crds import install_crds
from testbed.kubelet_emulator import KubeletEmulator
from testbed.nodes import create_node, delete_node
from testbed.objects import create_resource
from testbed.plugin_process import PluginProcess, redfish_source_args
from testbed.process import ComponentProcess
from testbed.wait import wait_for

RESOURCES = path(API_VERSION, "composableresources")
OPS_NS = "composable-dra"


@dataclass
class Bed:
    kube: Kube
    emulator: EmulatorProcess
    fabric: str
    node: str  # the Kubernetes node on fabric host node-1
    plugin: PluginProcess
    kubelet: KubeletEmulator
    operator: ComponentProcess

    def resource(self, name: str) -> JSON | None:
        return self.kube.get_or_none(path(API_VERSION, "composableresources", name))

    def phase(self, name: str) -> str | None:
        r = self.resource(name)
        return None if r is None else (r.get("status") or {}).get("phase")

    def describe(self, name: str) -> str:
        return f"{self.resource(name)}\n{self.operator.log_tail()}\n{self.plugin.log_tail()}"

    def wait_gone(self, name: str, what: str, timeout: float = 60) -> None:
        wait_for(
            lambda: self.resource(name) is None,
            timeout,
            what,
            describe=lambda: self.describe(name),
        )

    def wait_online(self, name: str, what: str = "the resource to be Online") -> None:
        wait_for(
            lambda: self.phase(name) == "Online", 60, what, describe=lambda: self.describe(name)
        )

    def block(self, block_id: str) -> dict[str, Any]:
        state: dict[str, Any] = self.emulator.state()["blocks"][block_id]
        return state

    def local_uuids(self) -> set[str]:
        slices = self.kube.get(
            path("resource.k8s.io/v1", "resourceslices"), fieldSelector=f"spec.nodeName={self.node}"
        )["items"]
        return {
            d["attributes"]["uuid"]["string"].lower().removeprefix("gpu-")
            for s in slices
            for d in s["spec"].get("devices", [])
        }


@pytest.fixture
def bed(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> Iterator[Bed]:
    emulator = EmulatorProcess(async_polls=1, workdir=short_tmp / "emulator")
    yield from start_bed(
        kube_json, control_plane, short_tmp, unique, emulator, {"backend": "redfish-composition"}
    )


# Long because it starts the bed's parts in order, each needing the one before.
def start_bed(
    kube_json: Kube,
    control_plane: ControlPlane,
    short_tmp: Path,
    unique: str,
    emulator: EmulatorProcess,
    backend: dict[str, Any],
    secret: dict[str, str] | None = None,
) -> Iterator[Bed]:
    """The operator, one node with its plugin, and a Fabric of ``backend`` (spec fields)
    on ``emulator``; ``secret``: the credentials Secret's keys (default: the emulator's
    user). Everything is cleaned up when the generator is closed."""
    install_crds(kube_json)
    if kube_json.get_or_none(path("v1", "namespaces", OPS_NS)) is None:
        kube_json.create(path("v1", "namespaces"), {"metadata": {"name": OPS_NS}})
    emulator.start()
    fabric = f"lab-{unique}"
    keys = secret or {"username": "admin", "password": "admin"}
    kube_json.create(
        path("v1", "secrets", namespace=OPS_NS),
        {
            "metadata": {"name": fabric},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()},
        },
    )
    kube_json.create(
        path(API_VERSION, "fabrics"),
        {
            "apiVersion": API_VERSION,
            "kind": "Fabric",
            "metadata": {"name": fabric},
            "spec": {
                **backend,
                "endpoint": emulator.url,
                "credentialsSecret": {"name": fabric, "namespace": OPS_NS},
                "pollIntervalSeconds": 5,
                "operationTimeoutSeconds": 60,
            },
        },
    )
    node = f"n1-{unique}"
    create_node(kube_json.api, node, system_uuid=host_uuid("node-1"))
    creds = short_tmp / "redfish.yaml"
    creds.write_text("username: admin\npassword: admin\n")
    kubelet = KubeletEmulator(kube_json, node, short_tmp / "kubelet", short_tmp / "cdi")
    kubelet.start()
    plugin = PluginProcess.beside(
        kubelet,
        node,
        control_plane.kubeconfig,
        short_tmp / "plugin",
        redfish_source_args(emulator.url, creds, 1),
    )
    plugin.start()
    operator = ComponentProcess(
        "operator",
        [
            f"--kubeconfig={control_plane.kubeconfig}",
            "--leader-elect-namespace=kube-system",
            f"--leader-elect-lease=operator-{unique}",
            "--metrics-port=0",
            "--online-poll-seconds=2",
        ],
        short_tmp / "operator",
    ).start()
    yield Bed(kube_json, emulator, fabric, node, plugin, kubelet, operator)
    for r in kube_json.get(RESOURCES)["items"]:
        if r["spec"]["fabric"] == fabric:
            kube_json.delete(path(API_VERSION, "composableresources", r["metadata"]["name"]))
    wait_for(
        lambda: not [r for r in kube_json.get(RESOURCES)["items"] if r["spec"]["fabric"] == fabric],
        60,
        "the resources to go",
        describe=operator.log_tail,
    )
    operator.stop()
    plugin.stop()
    kubelet.stop()
    delete_node(kube_json.api, node)
    kube_json.delete(path(API_VERSION, "fabrics", fabric))
    emulator.stop()


def composable(bed: Bed, name: str, block: str, **spec: Any) -> JSON:
    return create_resource(
        bed.kube, name, bed.fabric, block, bed.node, model="NVIDIA H100 80GB HBM3", **spec
    )


def test_attach_online_and_detach_on_delete(bed: Bed, unique: str) -> None:
    name = f"cr-{unique}"
    assert bed.block("gpu-1")["state"] == "Unused"
    composable(bed, name, "gpu-1")
    bed.wait_online(name)
    # The fabric shows the composition, the node shows the device, conditions agree.
    block = bed.block("gpu-1")
    assert block["state"] == "Composed" and block["system"] == "node-1"
    status = bed.resource(name)["status"]  # type: ignore[index]
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {names.DEVICE_VISIBLE: "True", names.ATTACHED: "True", names.READY: "True"}
    uuid = status["deviceUUID"].lower().removeprefix("gpu-")
    assert uuid == block["uuid"].lower().removeprefix("gpu-")
    # Idle (no claimRef): the node publishes the attached GPU as a local device.
    wait_for(lambda: uuid in bed.local_uuids(), 30, "the GPU in the node's slice")

    bed.kube.delete(path(API_VERSION, "composableresources", name))
    bed.wait_gone(name, "the resource to be deleted")
    assert bed.block("gpu-1")["state"] == "Unused"
    wait_for(lambda: uuid not in bed.local_uuids(), 30, "the GPU to leave the node's slice")
    rules = bed.kube.get(
        path("resource.k8s.io/v1", "devicetaintrules"),
        labelSelector=f"{names.PREFIX}/resource={name}",
    )["items"]
    assert rules == []


def test_redfish_zones_backend_attaches_by_patch(bed: Bed, unique: str) -> None:
    """A Fabric of backend redfish-zones composes by PATCHing the system's block list."""
    bed.kube.merge_patch(
        path(API_VERSION, "fabrics", bed.fabric), {"spec": {"backend": "redfish-zones"}}
    )
    # The actions would fail: only the PATCH path can bring the device Online.
    bed.emulator.add_fault({"kind": "status503", "path": "AddResourceBlock", "count": 10000})
    bed.emulator.add_fault({"kind": "status503", "path": "RemoveResourceBlock", "count": 10000})
    name = f"cr-{unique}"
    composable(bed, name, "gpu-2")
    bed.wait_online(name, "the resource to be Online through the zones backend")
    assert bed.block("gpu-2")["state"] == "Composed" and bed.block("gpu-2")["system"] == "node-1"
    bed.kube.delete(path(API_VERSION, "composableresources", name))
    bed.wait_gone(name, "the resource to be detached and deleted")
    assert bed.block("gpu-2")["state"] == "Unused"


def test_device_serving_a_claim_is_not_published_locally(bed: Bed, unique: str) -> None:
    name = f"cr-{unique}"
    composable(
        bed, name, "gpu-2", claimRef={"namespace": "default", "name": "some-claim", "uid": "1234"}
    )
    bed.wait_online(name)
    uuid = bed.resource(name)["status"]["deviceUUID"].lower().removeprefix("gpu-")  # type: ignore[index]
    assert uuid not in bed.local_uuids()
    # Released: the scaler clears claimRef, and the GPU becomes an idle local device.
    bed.kube.merge_patch(
        path(API_VERSION, "composableresources", name), {"spec": {"claimRef": None}}
    )
    wait_for(lambda: uuid in bed.local_uuids(), 30, "the idle GPU in the node's slice")


def test_detach_waits_while_a_claim_uses_the_device(bed: Bed, unique: str, namespace: str) -> None:
    name = f"cr-{unique}"
    composable(bed, name, "gpu-3")
    bed.wait_online(name)
    uuid = bed.resource(name)["status"]["deviceUUID"]  # type: ignore[index]
    wait_for(lambda: uuid.lower().removeprefix("gpu-") in bed.local_uuids(), 30, "local GPU")
    # A pod claims exactly that GPU through the node's slice.
    cls = f"uuid-{unique}"
    bed.kube.create(
        path("resource.k8s.io/v1", "deviceclasses"),
        {
            "metadata": {"name": cls},
            "spec": {
                "selectors": [
                    {
                        "cel": {
                            "expression": f'device.driver == "{names.DRIVER}" && '
                            f'device.attributes["{names.DRIVER}"].uuid == "{uuid}"'
                        }
                    }
                ]
            },
        },
    )
    bed.kube.create(
        path("resource.k8s.io/v1", "resourceclaims", namespace=namespace),
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}
            },
        },
    )
    pod_path = path("v1", "pods", "user", namespace=namespace)
    bed.kube.create(
        path("v1", "pods", namespace=namespace),
        {
            "metadata": {"name": "user"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "example.invalid/cuda",
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
            },
        },
    )
    wait_for(
        lambda: (bed.kube.get(pod_path).get("status") or {}).get("phase") == "Running",
        60,
        "the pod to run",
    )

    bed.kube.delete(path(API_VERSION, "composableresources", name))
    wait_for(
        lambda: any(
            c.get("reason") == "InUseByClaim"
            for c in (bed.resource(name) or {}).get("status", {}).get("conditions", [])
        ),
        60,
        "the detach to wait for the claim",
        describe=lambda: bed.describe(name),
    )
    assert bed.phase(name) == "Detaching"
    assert bed.block("gpu-3")["state"] == "Composed"  # still attached
    rules = bed.kube.get(
        path("resource.k8s.io/v1", "devicetaintrules"),
        labelSelector=f"{names.PREFIX}/resource={name}",
    )["items"]
    assert rules and rules[0]["spec"]["taint"]["effect"] == "NoSchedule"

    # The pod ends, the claim is deallocated: now the device goes back to the pool.
    bed.kube.delete(pod_path)
    bed.kube.delete(path("resource.k8s.io/v1", "resourceclaims", "gpu", namespace=namespace))
    bed.wait_gone(name, "the detach to finish", 90)
    assert bed.block("gpu-3")["state"] == "Unused"
    bed.kube.delete(path("resource.k8s.io/v1", "deviceclasses", cls))


def owned_by(bed: Bed, request: str) -> list[JSON]:
    return [
        r
        for r in bed.kube.get(RESOURCES)["items"]
        if r["metadata"].get("labels", {}).get(names.LABEL_REQUEST) == request
    ]


def test_composability_request_keeps_its_size(bed: Bed, unique: str) -> None:
    name = f"req-{unique}"
    bed.kube.create(
        path(API_VERSION, "composabilityrequests"),
        {
            "apiVersion": API_VERSION,
            "kind": "ComposabilityRequest",
            "metadata": {"name": name},
            "spec": {
                "fabric": bed.fabric,
                "model": "NVIDIA H100 80GB HBM3",
                "targetNode": bed.node,
                "size": 2,
                "maxSize": 3,
            },
        },
    )
    request = path(API_VERSION, "composabilityrequests", name)

    def online() -> int:
        return int((bed.kube.get(request).get("status") or {}).get("online", 0))

    wait_for(
        lambda: online() == 2,
        90,
        "two devices online",
        describe=lambda: f"{bed.kube.get(request)}\n{bed.operator.log_tail()}",
    )
    composed = [b for b, s in bed.emulator.state()["blocks"].items() if s["state"] == "Composed"]
    assert sorted(composed) == sorted(r["spec"]["deviceID"] for r in owned_by(bed, name))
    assert all(bed.block(b)["system"] == "node-1" for b in composed)

    bed.kube.merge_patch(request, {"spec": {"size": 1}})
    wait_for(lambda: len(owned_by(bed, name)) == 1, 90, "the request to shrink to one")
    wait_for(
        lambda: sum(s["state"] == "Composed" for s in bed.emulator.state()["blocks"].values()) == 1,
        60,
        "one block left composed",
    )
    bed.kube.delete(request)
    for r in owned_by(bed, name):
        bed.kube.delete(path(API_VERSION, "composableresources", r["metadata"]["name"]))


def test_fabric_status_and_orphan_detach(bed: Bed) -> None:
    fabric = path(API_VERSION, "fabrics", bed.fabric)
    wait_for(
        lambda: (bed.kube.get(fabric).get("status") or {}).get("reachable") is True,
        60,
        "the Fabric to report reachable",
    )
    status = bed.kube.get(fabric)["status"]
    assert status["lastSyncTime"]
    assert sum(e["count"] for e in status["freeDevices"]) == 8
    # Someone attaches a block out of band: the operator finds the orphan and detaches it.
    from composable_dra.fabric.redfish import RedfishCompositionBackend

    outside = RedfishCompositionBackend(bed.emulator.url, "admin", "admin")
    op = outside.attach("gpu-4", "node-1")
    assert op is not None  # the emulator runs changes as tasks here
    wait_for(lambda: outside.operation_status(op).state == "done", 30, "the out-of-band attach")
    assert bed.block("gpu-4")["state"] == "Composed"
    outside.close()
    bed.kube.merge_patch(
        fabric, {"spec": {"orphanPolicy": "Detach", "orphanGracePeriodSeconds": 1}}
    )
    wait_for(
        lambda: bed.block("gpu-4")["state"] == "Unused",
        90,
        "the orphan to be detached",
        describe=bed.operator.log_tail,
    )
    events = bed.kube.get(path("v1", "events", namespace="default"))["items"]
    assert any(
        e["reason"] == "OrphanDevice" and e["involvedObject"]["name"] == bed.fabric for e in events
    )


def test_the_operator_exits_at_once_on_sigterm(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> None:
    # kopf gives a task still pending at its exit 5 s before cancelling it; the waiter on
    # the operator's stop flag was one until the flag was raised on cleanup. A rolling
    # update or a suite's teardown waited those 5 s at every stop. The signal comes once
    # the operator is past its startup (a resource it watches carries its finalizer): a
    # signal during startup's API discovery still waits kopf's 5 s for the discovery's
    # retries, which only cancellation ends.
    install_crds(kube_json)
    name = f"sigterm-{unique}"
    create_resource(kube_json, name, "no-such-fabric", "block-0", "no-such-node")
    operator = ComponentProcess(
        "operator",
        [f"--kubeconfig={control_plane.kubeconfig}", "--no-leader-elect", "--metrics-port=0"],
        short_tmp / "operator",
    ).start()
    try:
        wait_for(
            lambda: (
                names.FINALIZER
                in kube_json.get(path(API_VERSION, "composableresources", name))["metadata"].get(
                    "finalizers", []
                )
            ),
            60,
            "the operator's finalizer on a resource it watches",
            describe=operator.log_tail,
        )
        assert operator.proc is not None
        start = time.monotonic()
        operator.proc.send_signal(signal.SIGTERM)
        assert operator.proc.wait(30) == 0, operator.log_tail()
        took = time.monotonic() - start
    finally:
        operator.stop()
        # The operator is gone: its finalizer goes by hand, or the resource stays.
        kube_json.merge_patch(
            path(API_VERSION, "composableresources", name), {"metadata": {"finalizers": None}}
        )
        kube_json.delete(path(API_VERSION, "composableresources", name))
    assert took < 5, f"{took:.1f} s from SIGTERM to exit\n{operator.log_tail()}"
    assert any("SIGTERM" in str(e.get("event")) for e in operator.log_events())
