"""A seamless plugin upgrade with the real kubelet, as a DaemonSet with ``maxSurge: 1``
rolls it: the new plugin instance starts beside the old one (sockets named with its pod
UID), the kubelet registers both and calls the newest, the old one stops. Pods keep
running, and no prepare or unprepare call is lost or fails on the way."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from dra_driver.cdi import spec_file_name
from dra_driver.checkpoint import Checkpoint
from dra_driver.grpc_server import registration_socket, service_socket
from testbed import ControlPlane
from testbed.objects import ensure_device_class
from testbed.plugin_process import write_static_devices
from testbed.realnode import RealNode
from testbed.realnodes import (
    RESOURCE,
    gone,
    node_binaries,
    pod_with_claim,
    wait_output,
    wait_running,
)
from testbed.wait import wait_for

pytestmark = pytest.mark.e2e

PREPARE = "composable_dra_plugin_prepare_seconds_count"
UNPREPARE = "composable_dra_plugin_unprepare_seconds_count"
OLD_UID = str(uuid.uuid4())
NEW_UID = str(uuid.uuid4())


@pytest.fixture
def real_node(control_plane: ControlPlane, unique: str) -> Iterator[RealNode]:
    # A short work directory: the registration socket's name carries a pod UID, and gRPC
    # binds a unix socket path of at most 105 characters.
    workdir = Path("/tmp") / uuid.uuid4().hex[:6]
    workdir.mkdir()
    node = RealNode(
        f"real-{unique}",
        node_binaries(),
        control_plane,
        workdir,
        plugin_args=[f"--rolling-update-uid={OLD_UID}"],
    )
    try:
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def claim_uid(kube: Kube, namespace: str, name: str) -> str:
    uid: str = kube.get(path(RESOURCE, "resourceclaims", name, namespace=namespace))["metadata"][
        "uid"
    ]
    return uid


# Long because it is one scenario read top to bottom; its steps share what it built.
def test_plugin_replaced_while_pods_run_loses_no_call(
    real_node: RealNode, kube_json: Kube, namespace: str
) -> None:
    t0 = time.monotonic()
    old = real_node.plugin
    assert old is not None
    write_static_devices(
        old.static_file,
        [
            {
                "uuid": f"GPU-{uuid.uuid4()}",
                "productName": "Test GPU",
                "model": "T",
                "memory": "1Gi",
            }
            for _ in range(3)
        ],
    )
    real_node.start_plugin()
    ensure_device_class(kube_json)
    assert registration_socket(real_node.plugins_registry_dir, names.DRIVER, OLD_UID).exists()

    pod_with_claim(kube_json, real_node, namespace, "first")
    wait_running(kube_json, real_node, namespace, "first")
    wait_output(real_node, namespace, "first", "COMPOSABLE_GPU_UUIDS=")
    first_spec = real_node.cdi_dir / spec_file_name(claim_uid(kube_json, namespace, "first"))
    assert first_spec.exists()
    assert real_node.plugin_metric(PREPARE, result="ok") == 1
    assert real_node.plugin_metric(PREPARE, result="error") == 0

    # The rollout: the new pod starts beside the old one and the kubelet registers it.
    new = real_node.start_plugin_instance(NEW_UID)
    new_reg = registration_socket(real_node.plugins_registry_dir, names.DRIVER, NEW_UID)
    new_service = service_socket(real_node.plugins_dir, names.DRIVER, NEW_UID)
    assert new_reg.exists() and new_service.exists()
    # From now on the kubelet calls the newest instance, the old one still running.
    pod_with_claim(kube_json, real_node, namespace, "between")
    wait_running(kube_json, real_node, namespace, "between")
    between_uid = claim_uid(kube_json, namespace, "between")
    assert new.metric(PREPARE, result="ok") == 1
    assert real_node.plugin_metric(PREPARE, result="ok") == 1
    # Then the old pod stops: it removes its own sockets and leaves the new ones alone.
    assert old.stop() == 0
    assert not registration_socket(real_node.plugins_registry_dir, names.DRIVER, OLD_UID).exists()
    assert not service_socket(real_node.plugins_dir, names.DRIVER, OLD_UID).exists()
    assert new_reg.exists() and new_service.exists()

    # With the old instance gone, a new pod is prepared by the new one.
    pod_with_claim(kube_json, real_node, namespace, "second")
    wait_running(kube_json, real_node, namespace, "second")
    wait_output(real_node, namespace, "second", "COMPOSABLE_GPU_UUIDS=")
    second_uid = claim_uid(kube_json, namespace, "second")
    assert new.metric(PREPARE, result="ok") == 2
    assert new.process.logged("claim prepared")

    # The first pod, prepared by the old instance, is unprepared by the new one.
    kube_json.delete(path("v1", "pods", "first", namespace=namespace))
    wait_for(
        gone(kube_json, path("v1", "pods", "first", namespace=namespace)),
        60,
        "the first pod to go",
        interval=0.3,
        describe=real_node.logs_tail,
    )
    wait_for(
        lambda: not first_spec.exists() and new.metric(UNPREPARE, result="ok") >= 1,
        30,
        "the new instance to unprepare the first claim",
        interval=0.2,
        describe=lambda: f"{real_node.logs_tail()}\n{new.process.log_tail()}",
    )

    # No call failed on either side, and the shared checkpoint holds exactly the second claim.
    assert not old.logged("claim not prepared") and not old.logged("unprepare failed")
    assert new.metric(PREPARE, result="error") == 0
    assert new.metric(UNPREPARE, result="error") == 0
    assert new.metric(UNPREPARE, result="ok") == 1
    assert (real_node.cdi_dir / spec_file_name(second_uid)).exists()
    checkpoint = Checkpoint(old.state_dir / "checkpoint.json", "boot-1")
    assert set(checkpoint.claims) == {between_uid, second_uid}
    assert {c.state for c in checkpoint.claims.values()} == {"prepared"}
    events = kube_json.get(path("v1", "events", namespace=namespace))["items"]
    failed = [e for e in events if e.get("type") == "Warning"]
    assert not failed, [f"{e['reason']}: {e['message']}" for e in failed]
    got: JSON = kube_json.get(path("v1", "pods", "second", namespace=namespace))
    assert got["status"]["phase"] == "Running"
    print(f"plugin replaced under running pods in {time.monotonic() - t0:.1f}s")
