"""The test bed itself: real scheduler and resourceclaim controller, kubelet emulator,
and a minimal DRA plugin over unix sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from testbed.kubelet_emulator import KubeletEmulator
from testbed.minimal_plugin import MinimalPlugin
from testbed.nodes import create_node, delete_node
from testbed.objects import pod_body
from testbed.wait import wait_for

RESOURCE = "resource.k8s.io/v1"


@pytest.fixture
def node(kube_json: Kube, unique: str) -> Iterator[str]:
    name = f"node-{unique}"
    create_node(kube_json.api, name)
    yield name
    delete_node(kube_json.api, name)


@pytest.fixture
def kubelet(kube_json: Kube, node: str, short_tmp: Path) -> Iterator[KubeletEmulator]:
    emulator = KubeletEmulator(kube_json, node, short_tmp / "kubelet", short_tmp / "cdi")
    with emulator:
        yield emulator


def start_plugin(
    kube: Kube, kubelet: KubeletEmulator, driver: str, *versions: str
) -> MinimalPlugin:
    plugin = MinimalPlugin(
        kube,
        driver,
        kubelet.plugins_registry_dir,
        kubelet.plugins_dir,
        kubelet.cdi_dir,
        versions=versions,
    )
    plugin.start()
    return plugin


def publish_device(kube: Kube, driver: str, node: str, device: str) -> None:
    kube.create(
        path(RESOURCE, "deviceclasses"),
        {
            "metadata": {"name": driver},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
    )
    kube.create(
        path(RESOURCE, "resourceslices"),
        {
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": device, "attributes": {"model": {"string": "test"}}}],
            },
        },
    )


def create_pod_with_template(kube: Kube, namespace: str, driver: str, node: str) -> JSON:
    kube.create(
        path(RESOURCE, "resourceclaimtemplates", namespace=namespace),
        {
            "metadata": {"name": "one-device"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "dev", "exactly": {"deviceClassName": driver}},
                        ]
                    }
                }
            },
        },
    )
    return kube.create(
        path("v1", "pods", namespace=namespace),
        pod_body("consumer", template="one-device", node=node, ref="dev"),
    )


def pod_phase(kube: Kube, namespace: str, name: str) -> str:
    pod = kube.get_or_none(path("v1", "pods", name, namespace=namespace))
    return "Gone" if pod is None else pod.get("status", {}).get("phase", "")


def run_claim_lifecycle(
    kube: Kube, kubelet: KubeletEmulator, plugin: MinimalPlugin, namespace: str, node: str
) -> None:
    driver = plugin.driver
    publish_device(kube, driver, node, "dev-0")
    pod = create_pod_with_template(kube, namespace, driver, node)
    pod_path = path("v1", "pods", "consumer", namespace=namespace)
    wait_for(
        lambda: pod_phase(kube, namespace, "consumer") == "Running",
        60,
        "the pod to run",
        describe=lambda: str(kube.get(pod_path).get("status")),
    )

    pod = kube.get(pod_path)
    assert pod["spec"]["nodeName"] == node  # bound by the real scheduler
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim_path = path(RESOURCE, "resourceclaims", claim_name, namespace=namespace)
    claim = kube.get(claim_path)  # created by the real resourceclaim controller
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"], r["device"]) for r in results] == [(driver, node, "dev-0")]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    claim_uid = claim["metadata"]["uid"]
    assert plugin.calls.prepared == [claim_uid]
    assert kubelet.prepared_devices(pod["metadata"]["uid"]) == {
        claim_uid: [f"example.com/test={claim_uid}-dev-0"]
    }

    kube.delete(pod_path)
    wait_for(lambda: pod_phase(kube, namespace, "consumer") == "Gone", 60, "the pod to go")
    assert plugin.calls.unprepared == [claim_uid]
    assert not (kubelet.cdi_dir / f"test-{claim_uid}.json").exists()
    # The generated claim goes with its pod, and with it the allocation.
    wait_for(lambda: kube.get_or_none(claim_path) is None, 60, "the claim to be deleted")


def test_pod_with_claim_template_is_scheduled_prepared_and_released(
    kube_json: Kube, kubelet: KubeletEmulator, namespace: str, node: str, unique: str
) -> None:
    plugin = start_plugin(
        kube_json, kubelet, f"smoke-{unique}.example.com", "v1.DRAPlugin", "v1beta1.DRAPlugin"
    )
    try:
        wait_for(
            lambda: kubelet.registered_drivers().get(plugin.driver) == "v1",
            30,
            "registration over v1",
        )
        assert plugin.calls.registration_status == [(True, "")]
        run_claim_lifecycle(kube_json, kubelet, plugin, namespace, node)
    finally:
        plugin.stop()


def test_plugin_serving_only_v1beta1_is_served(
    kube_json: Kube, kubelet: KubeletEmulator, namespace: str, node: str, unique: str
) -> None:
    plugin = start_plugin(kube_json, kubelet, f"beta-{unique}.example.com", "v1beta1.DRAPlugin")
    try:
        wait_for(
            lambda: kubelet.registered_drivers().get(plugin.driver) == "v1beta1",
            30,
            "registration over v1beta1",
        )
        run_claim_lifecycle(kube_json, kubelet, plugin, namespace, node)
    finally:
        plugin.stop()


def test_plugin_with_no_known_version_is_refused(
    kube_json: Kube, kubelet: KubeletEmulator, unique: str
) -> None:
    plugin = start_plugin(kube_json, kubelet, f"alpha-{unique}.example.com", "v1alpha4.DRAPlugin")
    try:
        wait_for(lambda: plugin.calls.registration_status, 30, "a registration verdict")
        registered, error = plugin.calls.registration_status[0]
        assert not registered
        assert "v1alpha4.DRAPlugin" in error
        assert plugin.driver not in kubelet.registered_drivers()
    finally:
        plugin.stop()
