"""The operator with a Fabric of backend fsas-fm, against the emulator's Fsas FM API.

Real control plane, the operator as its own process, the node's plugin (reading the same
emulator's Redfish view, as a node's driver sees hot-plugged GPUs), and the Fsas FM API
with its OAuth token endpoint: a ComposableResource is attached through the FM's
``machines/{m}/update`` (the Redfish actions are made to fail, so no other path could
bring it Online), goes Online, and is detached when deleted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.fabric.slots import is_slot
from composable_dra.k8s.kube import Kube, path
from composable_dra.model.names import ANN_POOL_DEVICE, normalize_uuid
from fabric_emulator.fsas.config import FsasConfig, process_args
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import host_uuid
from testbed import ControlPlane
from testbed.realnodes import gpu_env, suite_pod, wait_succeeded
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite
from tests.e2e.test_operator import Bed, composable, start_bed

FSAS = FsasConfig(
    tenant="tenant-e2e", realm="cdi-e2e", client_id="cdra", client_secret="e2e-secret"
)


@pytest.fixture
def fsas_bed(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> Iterator[Bed]:
    work = short_tmp / "emulator"
    work.mkdir(parents=True, exist_ok=True)
    emulator = EmulatorProcess(extra_args=process_args(work, FSAS), workdir=work)
    yield from start_bed(
        kube_json,
        control_plane,
        short_tmp,
        unique,
        emulator,
        {"backend": "fsas-fm", "fsas": {"tenantUUID": FSAS.tenant, "realm": FSAS.realm}},
        {
            "client_id": FSAS.client_id,
            "client_secret": FSAS.client_secret,
            "username": "admin",
            "password": "admin",
        },
    )


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


def test_an_fm_that_picks_the_gpu_gives_the_pod_the_gpu_it_picked(
    make_suite: MakeSuite, namespace: str
) -> None:
    """The FM as CoHDI's client and CI mock have it (attach by model, free GPUs only as
    counts): the pool offers slots, a pod's claim gets one, the FM picks the GPU, and the
    pod runs on that GPU (its CDI env names the FM's pick); once idle, the GPU is detached
    by the id the FM gave it and the slot count is back."""
    picking = FsasConfig(
        FSAS.tenant,
        FSAS.realm,
        FSAS.client_id,
        FSAS.client_secret,
        attach_by_model=True,
        list_resources=False,
    )
    suite = make_suite(hosts=("node-1",), real_hosts=("node-1",), fsas=picking, no_removal=4)
    for action in ("AddResourceBlock", "RemoveResourceBlock"):  # only the FM API may change it
        suite.emulator.add_fault({"kind": "status503", "path": action, "count": 100000})
    # node-1's fabric (zone-1) has 4 H100 and 1 L40S free: five slots, no block ids.
    wait_for(lambda: len(suite.pool_devices()) == 5, 30, "five slots in the pool")
    assert all(is_slot(d) for _, d in suite.pool_devices())

    suite_pod(suite, namespace, "p1", run_seconds=1)
    wait_succeeded(suite, namespace, "p1")  # on the GPU the FM picked
    [cr] = suite.resources()
    slot, picked = cr["spec"]["deviceID"], cr["status"]["fabricDeviceID"]
    assert is_slot(slot) and not is_slot(picked)
    assert suite.composed() == {picked: "node-1"}
    # The claim was allocated the slot (it keeps that name until the claim is released).
    assert cr["metadata"]["annotations"][ANN_POOL_DEVICE] == slot
    uuid = normalize_uuid(str(suite.emulator.state()["blocks"][picked]["uuid"]))
    assert normalize_uuid(cr["status"]["deviceUUID"]) == uuid
    assert normalize_uuid(gpu_env(suite, namespace, "p1")["COMPOSABLE_GPU_UUIDS"]) == uuid

    # Idle past the window: detached (by the FM's res_uuid), and five slots again.
    wait_for(
        lambda: suite.composed() == {} and suite.resources() == [],
        90,
        "the idle GPU to be detached through the FM",
        describe=suite.describe,
    )
    wait_for(lambda: len(suite.pool_devices()) == 5, 60, "five slots again")
    assert [f.get("fired", 0) for f in suite.emulator.faults()][-2:] == [0, 0]
