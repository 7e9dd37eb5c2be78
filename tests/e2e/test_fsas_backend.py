"""The operator with a Fabric of backend fsas-fm, against the emulator's Fsas FM API.

Real control plane, the operator as its own process, the node's plugin (reading the same
emulator's Redfish view, as a node's driver sees hot-plugged GPUs), and the Fsas FM API
with its OAuth token endpoint: a ComposableResource is attached through the FM's
``machines/{m}/update`` (the Redfish actions are made to fail, so no other path could
bring it Online), goes Online, and is detached when deleted.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.kube import Kube, path
from fabric_emulator.fsas.config import FsasConfig, process_args
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import host_uuid
from hack.localcluster import ControlPlane
from hack.localcluster.crds import install_crds
from hack.localcluster.kubelet_emulator import KubeletEmulator
from hack.localcluster.nodes import create_node, delete_node
from hack.localcluster.plugin_process import PluginProcess
from hack.localcluster.process import ComponentProcess
from hack.localcluster.wait import wait_for
from tests.e2e.test_operator import OPS_NS, RESOURCES, Bed, composable

FSAS = FsasConfig(
    tenant="tenant-e2e", realm="cdi-e2e", client_id="cdra", client_secret="e2e-secret"
)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def fsas_bed(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> Iterator[Bed]:
    install_crds(kube_json)
    if kube_json.get_or_none(path("v1", "namespaces", OPS_NS)) is None:
        kube_json.create(path("v1", "namespaces"), {"metadata": {"name": OPS_NS}})
    work = short_tmp / "emulator"
    work.mkdir(parents=True, exist_ok=True)
    emulator = EmulatorProcess(extra_args=process_args(work, FSAS), workdir=work)
    emulator.start()
    fabric = f"fsas-{unique}"
    kube_json.create(
        path("v1", "secrets", namespace=OPS_NS),
        {
            "metadata": {"name": fabric},
            "data": {
                "client_id": _b64(FSAS.client_id),
                "client_secret": _b64(FSAS.client_secret),
                "username": _b64("admin"),
                "password": _b64("admin"),
            },
        },
    )
    kube_json.create(
        path(API_VERSION, "fabrics"),
        {
            "apiVersion": API_VERSION,
            "kind": "Fabric",
            "metadata": {"name": fabric},
            "spec": {
                "backend": "fsas-fm",
                "fsas": {"tenantUUID": FSAS.tenant, "realm": FSAS.realm},
                "endpoint": emulator.url,
                "credentialsSecret": {"name": fabric, "namespace": OPS_NS},
                "pollIntervalSeconds": 5,
                "operationTimeoutSeconds": 60,
            },
        },
    )
    node = f"f1-{unique}"
    create_node(kube_json.api, node, system_uuid=host_uuid("node-1"))
    creds = short_tmp / "redfish.yaml"
    creds.write_text("username: admin\npassword: admin\n")
    kubelet = KubeletEmulator(kube_json, node, short_tmp / "kubelet", short_tmp / "cdi")
    kubelet.start()
    plugin = PluginProcess(
        node=node,
        kubeconfig=control_plane.kubeconfig,
        plugins_registry_dir=kubelet.plugins_registry_dir,
        plugins_dir=kubelet.plugins_dir,
        cdi_dir=kubelet.cdi_dir,
        workdir=short_tmp / "plugin",
        extra_args=[
            "--device-source=redfish",
            f"--redfish-endpoint={emulator.url}",
            f"--redfish-credentials-file={creds}",
            "--poll-interval=1",
        ],
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
    try:
        yield Bed(kube_json, emulator, fabric, node, plugin, kubelet, operator)
    finally:
        for r in kube_json.get(RESOURCES)["items"]:
            if r["spec"]["fabric"] == fabric:
                kube_json.delete(path(API_VERSION, "composableresources", r["metadata"]["name"]))
        wait_for(
            lambda: (
                not [r for r in kube_json.get(RESOURCES)["items"] if r["spec"]["fabric"] == fabric]
            ),
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


def test_fsas_fm_attaches_and_detaches(fsas_bed: Bed, unique: str) -> None:
    bed = fsas_bed
    # Only the FM API may change the composition in this test.
    for action in ("AddResourceBlock", "RemoveResourceBlock"):
        bed.emulator.add_fault({"kind": "status503", "path": action, "count": 100000})
    name = f"fsas-{unique}"
    assert bed.block("gpu-4")["state"] == "Unused"
    composable(bed, name, "gpu-4")
    wait_for(
        lambda: bed.phase(name) == "Online",
        90,
        "the resource to be Online through the FM",
        describe=lambda: bed.describe(name),
    )
    block = bed.block("gpu-4")
    assert block["state"] == "Composed" and block["system"] == "node-1"
    status = bed.resource(name)["status"]  # type: ignore[index]
    assert status["deviceUUID"].lower().removeprefix("gpu-") == block["uuid"].lower().removeprefix(
        "gpu-"
    )
    assert status["fabricHost"] == host_uuid("node-1")  # the FM's machine UUID
    assert bed.emulator.admin("GET", "fsas/tokens")["granted"] >= 1

    bed.kube.delete(path(API_VERSION, "composableresources", name))
    wait_for(
        lambda: bed.resource(name) is None,
        90,
        "the resource to be detached through the FM and deleted",
        describe=lambda: bed.describe(name),
    )
    assert bed.block("gpu-4")["state"] == "Unused"
    fired = [r.get("fired", 0) for r in bed.emulator.faults()]
    assert fired == [0, 0], "a Redfish action was called: the change did not go through the FM"
