"""Device health on real kubelets (issue 29): a GPU the fabric reports unhealthy is
tainted in its pool within 10 s, the pod using it shows the health in its status
(``allocatedResourcesStatus``, fed by the plugin's NodeWatchResources stream), a new pod
gets a healthy GPU; a fatal fault evicts the pod (NoExecute) and its claim is served by
another GPU; the faulty GPU is detached and stays out of use until the fault clears,
after which it comes back; a healthy GPU stays Healthy in pod status for over twice the
kubelet's timeout (the plugins resend every 2 s: a 6 s timeout, not the default 30 s;
the kubelets resync every 2 s, not every minute). A GPU
fenced by hand (``composable.dra.io/fence``) is quarantined, and a diagnostic pod that
tolerates the quarantine still gets it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from api.v1alpha1 import API_VERSION as CR_API
from composable_dra.k8s.kube import JSON, NotFound, path
from composable_dra.model import names
from composable_dra.model.health_rules import TAINT_KEY
from composable_dra.model.names import ANN_FENCE, normalize_uuid
from dra_driver.health_stream import timeout_for
from fabric_emulator import host_bus
from testbed.harness import Suite, SuiteOptions
from testbed.objects import create_claim, pod_body
from testbed.realnode_pods import for_real_node
from testbed.realnodes import ENV_AND_WAIT, describe_nodes, suite_pod
from testbed.wait import holds_for, wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e

HOSTS = SuiteOptions().hosts
RESEND = 2  # the plugins' --health-resend: the kubelet's timeout is 6 s, not 30 s


def block_of(suite: Suite, ns: str, pod: str) -> tuple[str, str]:
    alloc = (suite.claim(ns, pod).get("status") or {}).get("allocation")
    assert alloc is not None
    (r,) = alloc["devices"]["results"]
    return str(r["pool"]), str(r["device"])


def pool_taints(suite: Suite, device: str) -> set[tuple[str, str]]:
    return {
        (t["value"], t["effect"])
        for s in suite.pool_slices()
        for d in s["spec"].get("devices", [])
        if d["name"] == device
        for t in d.get("taints", [])
        if t["key"] == TAINT_KEY
    }


def pod_health(suite: Suite, ns: str, pod: str) -> set[str]:
    """The health of every device in the pod's allocatedResourcesStatus."""
    statuses = suite.pod(ns, pod)["status"].get("containerStatuses") or []
    return {
        r.get("health", "")
        for s in statuses
        for a in s.get("allocatedResourcesStatus") or []
        for r in a.get("resources") or []
    }


def wait_running(suite: Suite, ns: str, pod: str) -> JSON:
    wait_for(
        lambda: suite.running(ns, pod),
        90,
        f"pod {pod} to run",
        describe=lambda: describe_nodes(suite),
    )
    return suite.pod(ns, pod)


def pod_gone(suite: Suite, ns: str, pod: str) -> bool:
    try:
        got = suite.pod(ns, pod)
    except NotFound:
        return True
    return bool(got["metadata"].get("deletionTimestamp"))


def tainted_then_shown(
    suite: Suite, ns: str, pod: str, tainted: Callable[[], bool], what: str
) -> None:
    """The fault just injected: ``tainted`` within 10 s, then ``pod`` shows its GPU
    Unhealthy in its status."""
    t0 = time.monotonic()
    wait_for(tainted, 10, what, describe=suite.describe)
    print(f"tainted after {time.monotonic() - t0:.1f}s", flush=True)
    wait_for(
        lambda: pod_health(suite, ns, pod) == {"Unhealthy"},
        30,
        f"{pod} to show its GPU Unhealthy",
        describe=lambda: str(suite.pod(ns, pod)["status"]),
    )


# Long because it is one scenario read top to bottom: each step starts from the last.
def test_a_fabric_fault_taints_shows_evicts_and_recovers(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite(
        real_hosts=HOSTS,
        poll_interval_seconds=5,
        no_removal=4,
        plugin_args=[f"--health-resend={RESEND}"],
        # The kubelet judges a device's staleness when it writes the pod's status: at
        # each resync (syncFrequency, 1 min by default), so the hold below sees one.
        kubelet_config={"syncFrequency": "2s"},
    )
    suite_pod(suite, namespace, "p1")
    wait_running(suite, namespace, "p1")
    pool, block = block_of(suite, namespace, "p1")
    assert "/" in pool  # a pool GPU, attached for p1
    wait_for(lambda: pod_health(suite, namespace, "p1") == {"Healthy"}, 30, "p1 Healthy")

    # Warning: kept from new pods (NoSchedule) within 10 s; p1 runs on, shown Unhealthy.
    suite.emulator.set_block_status(block, health="Warning")
    tainted_then_shown(
        suite,
        namespace,
        "p1",
        lambda: pool_taints(suite, block) == {("FabricWarning", "NoSchedule")},
        f"{block} tainted FabricWarning",
    )
    suite_pod(suite, namespace, "p2")
    wait_running(suite, namespace, "p2")
    assert block_of(suite, namespace, "p2")[1] != block  # a healthy GPU for the new pod
    assert suite.running(namespace, "p1")

    # Critical: fatal, NoExecute evicts p1; its claim is then served by another GPU.
    suite.emulator.set_block_status(block, health="Critical")
    wait_for(
        lambda: ("FabricCritical", "NoExecute") in pool_taints(suite, block),
        10,
        f"{block} tainted NoExecute",
    )
    wait_for(lambda: pod_gone(suite, namespace, "p1"), 60, "p1 evicted", describe=suite.describe)
    wait_for(
        lambda: not suite.claim(namespace, "p1").get("status", {}).get("reservedFor"),
        60,
        "claim p1 let go by the evicted pod",
    )
    wait_for(lambda: pod_gone_entirely(suite, namespace, "p1"), 60, "p1 deleted")
    again = suite.on_own_nodes(
        for_real_node(
            pod_body("p1-again", "p1", command=["sh", "-c", ENV_AND_WAIT]),
            None,
            next(iter(suite.real_nodes.values())).image,
        )
    )
    suite.kube.create(path("v1", "pods", namespace=namespace), again)
    wait_running(suite, namespace, "p1-again")
    assert block_of(suite, namespace, "p1")[1] != block

    # The faulty GPU is detached (nothing holds it) and stays tainted: never reused.
    wait_for(lambda: block not in suite.composed(), 60, f"{block} detached")
    wait_for(
        lambda: ("FabricCritical", "NoExecute") in pool_taints(suite, block),
        20,
        f"{block} published free but quarantined",
    )
    # The fault clears: after the recovery reads, the GPU is offered again, untainted.
    suite.emulator.set_block_status(block)
    wait_for(
        lambda: (pool, block) in suite.pool_devices() and not pool_taints(suite, block),
        30,
        f"{block} back in its pool, untainted",
    )

    # A healthy GPU stays Healthy in pod status for over twice the kubelet's timeout: no
    # Unknown from a starved stream (the timeout the plugins send: three resends).
    wait_for(lambda: pod_health(suite, namespace, "p2") == {"Healthy"}, 30, "p2 Healthy")
    holds_for(
        lambda: pod_health(suite, namespace, "p2") == {"Healthy"},
        2 * timeout_for(RESEND) + 1,
        "p2 Healthy",
        describe=lambda: str(suite.pod(namespace, "p2")["status"]),
    )


def pod_gone_entirely(suite: Suite, ns: str, pod: str) -> bool:
    try:
        suite.pod(ns, pod)
    except NotFound:
        return True
    return False


def node_events(suite: Suite, node: str) -> list[JSON]:
    items: list[JSON] = suite.kube.get(
        path("v1", "events", namespace="default"),
        fieldSelector=f"involvedObject.name={node},involvedObject.kind=Node",
    )["items"]
    return items


def local_device(suite: Suite, host: str, uuid: str) -> JSON | None:
    for dev in suite.local_devices(host):
        if normalize_uuid(dev["attributes"]["uuid"]["string"]) == uuid:
            return dev
    return None


def local_taints(suite: Suite, host: str, uuid: str) -> set[tuple[str, str]] | None:
    dev = local_device(suite, host, uuid)
    if dev is None:
        return None
    return {(t["value"], t["effect"]) for t in dev.get("taints", []) if t["key"] == TAINT_KEY}


def pinned_claim(suite: Suite, ns: str, name: str, dev: JSON, tolerate: str = "") -> None:
    """A claim for exactly the published device ``dev`` (by its UUID), tolerating the
    NoSchedule health taint of reason ``tolerate`` when given."""
    uuid = dev["attributes"]["uuid"]["string"]
    expression = f'device.attributes["{names.DRIVER}"].uuid == "{uuid}"'
    exactly: JSON = {
        "deviceClassName": names.DEVICE_CLASS,
        "selectors": [{"cel": {"expression": expression}}],
    }
    if tolerate:
        toleration = {"key": TAINT_KEY, "operator": "Equal", "value": tolerate}
        exactly["tolerations"] = [{**toleration, "effect": "NoSchedule"}]
    create_claim(suite.kube, ns, name, exactly=exactly)


# Long because it is one scenario read top to bottom: each step starts from the last.
def test_a_gpu_fenced_by_hand_is_quarantined_yet_a_diagnostic_pod_gets_it(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite(hosts=("node-1",), real_hosts=("node-1",))
    suite_pod(suite, namespace, "p1")
    pod = wait_running(suite, namespace, "p1")
    node = pod["spec"]["nodeName"]
    _, block = block_of(suite, namespace, "p1")
    (cr,) = [r for r in suite.resources() if r["spec"]["deviceID"] == block]
    cr_path = path(CR_API, "composableresources", cr["metadata"]["name"])
    uuid = normalize_uuid(cr["status"]["deviceUUID"])
    wait_for(lambda: pod_health(suite, namespace, "p1") == {"Healthy"}, 30, "p1 Healthy")

    # Fenced: NoSchedule only, the running pod stays and shows it; an Event says so.
    suite.kube.merge_patch(cr_path, {"metadata": {"annotations": {ANN_FENCE: "burn-in errors"}}})
    wait_for(
        lambda: pool_taints(suite, block) == {("Quarantined", "NoSchedule")},
        10,
        f"{block} quarantined in its pool",
        describe=suite.describe,
    )
    wait_for(lambda: pod_health(suite, namespace, "p1") == {"Unhealthy"}, 30, "p1 Unhealthy")
    messages = [e["message"] for e in node_events(suite, node) if e["reason"] == "DeviceUnhealthy"]
    assert any("Quarantined" in m and "burn-in errors" in m for m in messages), messages
    assert suite.running(namespace, "p1")

    # p1 goes: the GPU, released, is the node's own now, still quarantined there.
    suite.kube.delete(path("v1", "pods", "p1", namespace=namespace))
    wait_for(
        lambda: local_taints(suite, "node-1", uuid) == {("Quarantined", "NoSchedule")},
        60,
        "the released GPU published on the node, quarantined",
        describe=suite.describe,
    )
    # A diagnostic pod that tolerates the quarantine (and names the GPU) gets it.
    dev = local_device(suite, "node-1", uuid)
    assert dev is not None
    pinned_claim(suite, namespace, "diag", dev, tolerate="Quarantined")
    image = next(iter(suite.real_nodes.values())).image
    diag = for_real_node(pod_body("diag", "diag", command=["sh", "-c", ENV_AND_WAIT]), node, image)
    suite.kube.create(path("v1", "pods", namespace=namespace), diag)
    wait_running(suite, namespace, "diag")
    assert block_of(suite, namespace, "diag") == (node, dev["name"])

    # Released by hand: the device is healthy again after the recovery reads.
    suite.kube.merge_patch(cr_path, {"metadata": {"annotations": {ANN_FENCE: None}}})
    wait_for(lambda: local_taints(suite, "node-1", uuid) == set(), 30, "the fence lifted")
    wait_for(lambda: pod_health(suite, namespace, "diag") == {"Healthy"}, 30, "diag Healthy")


def host_gpu(suite: Suite, host: str, uuid: str) -> host_bus.HostGpu:
    root = suite.emulator.host_state_dir
    assert root is not None
    (gpu,) = [g for g in host_bus.gpus(root, host) if normalize_uuid(g.uuid) == uuid]
    return gpu


def set_ecc(suite: Suite, host: str, uuid: str, errors: int) -> None:
    """The GPU's volatile uncorrected (double-bit) ECC counter, as its host's NVML reads it
    (the fake NVML's shared state; the driver's reload resets it to 0)."""
    root = suite.emulator.host_state_dir
    assert root is not None
    gpu = host_gpu(suite, host, uuid)
    host_bus.update(root, host, gpu.uuid, lambda g: replace(g, ecc_uncorrected_volatile=errors))


# Long because it is one scenario read top to bottom: each step starts from the last.
@pytest.mark.versions("1.36")
def test_an_nvml_ecc_fault_taints_the_node_gpu_shows_in_pod_status_and_clears(
    make_suite: MakeSuite, namespace: str
) -> None:
    """The plugin on the redfish source judges health by the host's NVML too (the fake
    NVML over the host state, ``--nvml-health``): a double-bit ECC error on a GPU of the
    node's own slice taints it within 10 s, the pod using it shows it Unhealthy and runs
    on (not fatal); once the counter is back to 0 the GPU is untainted and Healthy."""
    suite = make_suite(hosts=("node-1",), real_hosts=("node-1",), nvml_health_hosts=("node-1",))
    suite_pod(suite, namespace, "p1")
    pod = wait_running(suite, namespace, "p1")
    node = pod["spec"]["nodeName"]
    _, block = block_of(suite, namespace, "p1")
    (cr,) = [r for r in suite.resources() if r["spec"]["deviceID"] == block]
    uuid = normalize_uuid(cr["status"]["deviceUUID"])
    # p1 goes: its GPU, released, is the node's own (its local slice).
    suite.kube.delete(path("v1", "pods", "p1", namespace=namespace))
    wait_for(
        lambda: local_taints(suite, "node-1", uuid) == set(),
        60,
        "the released GPU published on the node",
        describe=suite.describe,
    )
    dev = local_device(suite, "node-1", uuid)
    assert dev is not None
    pinned_claim(suite, namespace, "p2", dev)
    image = next(iter(suite.real_nodes.values())).image
    p2 = for_real_node(pod_body("p2", "p2", command=["sh", "-c", ENV_AND_WAIT]), node, image)
    suite.kube.create(path("v1", "pods", namespace=namespace), p2)
    wait_running(suite, namespace, "p2")
    wait_for(lambda: pod_health(suite, namespace, "p2") == {"Healthy"}, 30, "p2 Healthy")

    set_ecc(suite, "node-1", uuid, 2)
    tainted_then_shown(
        suite,
        namespace,
        "p2",
        lambda: local_taints(suite, "node-1", uuid) == {("EccError", "NoSchedule")},
        "the GPU tainted EccError in the node's slice",
    )
    assert suite.running(namespace, "p2")  # not fatal: it runs on

    # The counter is volatile (a driver reload resets it): healthy reads lift the taint.
    set_ecc(suite, "node-1", uuid, 0)
    wait_for(lambda: local_taints(suite, "node-1", uuid) == set(), 30, "the taint lifted")
    wait_for(lambda: pod_health(suite, namespace, "p2") == {"Healthy"}, 30, "p2 Healthy again")
