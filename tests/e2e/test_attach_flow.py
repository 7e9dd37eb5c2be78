"""The attach flow end to end: real control plane and scheduler, the Redfish
emulator as the fabric, every component as a process of its own (operator, pool
publisher, scaler, one plugin per node), and real nodes (the upstream kubelet,
containerd, runc) whose containers print the GPUs they were given.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from composable_dra.fabric.redfish import RedfishCompositionBackend
from composable_dra.k8s.kube import JSON, path
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from dra_driver.cdi import spec_file_name
from testbed.harness import Suite, SuiteOptions
from testbed.realnodes import cdi_dir_of, describe_nodes, gpu_env, plugin_of, suite_pod
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e
HOSTS = SuiteOptions().hosts  # node-1, node-2, node-3


# -- helpers -------------------------------------------------------------------------------


def allocation(suite: Suite, ns: str, name: str) -> JSON | None:
    alloc: JSON | None = (suite.claim(ns, name).get("status") or {}).get("allocation")
    return alloc


def result(suite: Suite, ns: str, name: str) -> JSON:
    alloc = allocation(suite, ns, name)
    assert alloc is not None
    [r] = alloc["devices"]["results"]
    return dict(r)


def wait_running(suite: Suite, ns: str, name: str, timeout: float = 60) -> JSON:
    wait_for(
        lambda: suite.running(ns, name),
        timeout,
        f"pod {ns}/{name} to run",
        describe=lambda: describe_nodes(suite) + f"\nclaim: {suite.claim(ns, name).get('status')}",
    )
    return suite.pod(ns, name)


def scheduled_events(suite: Suite, ns: str, name: str) -> list[str]:
    return [e["reason"] for e in suite.pod_events(ns, name) if e["reason"] == "Scheduled"]


def attach_directly(suite: Suite, block: str, host: str) -> None:
    """Attach through the fabric's own API, as an administrator would (no Kubernetes)."""
    backend = RedfishCompositionBackend(
        suite.emulator.url, suite.emulator.user, suite.emulator.password
    )
    try:
        op = backend.attach(block, host)
        wait_for(
            lambda: op is None or backend.operation_status(op).state == "done",
            30,
            f"the fabric to attach {block} to {host}",
        )
        assert backend.inventory().devices[block].state == "attached"
    finally:
        backend.close()


def block_uuid(suite: Suite, block: str) -> str:
    return normalize_uuid(str(suite.emulator.state()["blocks"][block]["uuid"]))


def local_uuids(suite: Suite, host: str) -> set[str]:
    return {normalize_uuid(d["attributes"]["uuid"]["string"]) for d in suite.local_devices(host)}


def assert_consistent(suite: Suite) -> None:
    """The emulator and the ComposableResources agree: every composed block has exactly one
    live resource for that block and the node of that host, and vice versa."""
    composed = suite.composed()
    live = {}
    for r in suite.resources():
        if (r.get("status") or {}).get("phase") in ("Online", "Attaching", "Detaching"):
            assert r["spec"]["deviceID"] not in live, (
                f"two resources for {r['spec']['deviceID']}: {suite.describe()}"
            )
            live[r["spec"]["deviceID"]] = r["spec"]["targetNode"]
    assert set(composed) == set(live), (composed, live)
    for block, host in composed.items():
        assert live[block] == suite.node_of(host)


# -- scenarios -----------------------------------------------------------------------------


def test_1_a_free_local_gpu_serves_a_pod_without_any_fabric_call(
    make_suite: MakeSuite, namespace: str
) -> None:
    # node-3 is real: the only node with a GPU, where the pod must run.
    suite = make_suite(real_hosts=("node-3",))
    # An administrator attached gpu-6 to node-3's host long ago: a local GPU of node-3.
    attach_directly(suite, "gpu-6", "node-3")
    uuid = block_uuid(suite, "gpu-6")
    wait_for(lambda: uuid in local_uuids(suite, "node-3"), 30, "node-3 to publish gpu-6")
    wait_for(
        lambda: "gpu-6" not in {d for _, d in suite.pool_devices()},
        30,
        "the pool to drop the attached gpu-6",
    )
    before = suite.emulator.state()

    suite_pod(suite, namespace, "p1")
    wait_running(suite, namespace, "p1")
    r = result(suite, namespace, "p1")
    assert (r["pool"], r["request"]) == (suite.node_of("node-3"), "gpu/local")
    assert suite.pod(namespace, "p1")["spec"]["nodeName"] == suite.node_of("node-3")
    assert normalize_uuid(gpu_env(suite, namespace, "p1")["COMPOSABLE_GPU_UUIDS"]) == uuid
    assert suite.resources() == []
    after = suite.emulator.state()
    assert after["blocks"] == before["blocks"]
    assert after["tasks"] == before["tasks"]  # no composition request at all


@pytest.mark.versions("1.36")
def test_2_a_pool_gpu_is_attached_to_the_chosen_node_in_one_scheduling_cycle(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite(real_hosts=HOSTS)
    suite_pod(suite, namespace, "p1")
    wait_for(
        lambda: allocation(suite, namespace, "p1"), 30, "the allocation", describe=suite.describe
    )
    first = allocation(suite, namespace, "p1")
    pod = wait_running(suite, namespace, "p1")
    node = pod["spec"]["nodeName"]
    r = result(suite, namespace, "p1")
    assert r["request"] == "gpu/pool"
    assert r["bindingConditions"] == [names.FABRIC_DEVICE_READY]
    assert allocation(suite, namespace, "p1") == first  # never deallocated nor changed
    block = r["device"]
    [status] = suite.claim(namespace, "p1")["status"]["devices"]
    conds = {c["type"]: c["status"] for c in status["conditions"]}
    assert conds == {names.FABRIC_DEVICE_READY: "True"}
    assert normalize_uuid(status["data"]["uuid"]) == block_uuid(suite, block)
    # The fabric shows the block composed with the host of the chosen node.
    assert suite.composed() == {block: suite.host_of_node(node)}
    [cr] = suite.resources()
    assert (cr["spec"]["deviceID"], cr["spec"]["targetNode"], cr["status"]["phase"]) == (
        block,
        node,
        "Online",
    )
    assert cr["spec"]["claimRef"]["uid"] == suite.claim(namespace, "p1")["metadata"]["uid"]
    # Scheduled once: one Scheduled event, no failed attempt after the binding wait.
    assert scheduled_events(suite, namespace, "p1") == ["Scheduled"]
    reasons = [e["reason"] for e in suite.pod_events(namespace, "p1")]
    assert "BindingConditionsPending" in reasons
    assert "FailedScheduling" not in reasons
    # The GPU keeps its pool identity while allocated: not also a local device of the node.
    host = suite.host_of_node(node)
    assert block_uuid(suite, block) not in local_uuids(suite, host)
    assert ("/" in r["pool"]) and (r["pool"], block) in suite.pool_devices()
    # The container got the attached GPU, through the CDI spec the plugin wrote.
    claim = suite.claim(namespace, "p1")
    env = gpu_env(suite, namespace, "p1")
    assert env["COMPOSABLE_GPU_UUIDS"] == status["data"]["uuid"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{status['data']['uuid']}"  # bare UUID
    assert env["COMPOSABLE_GPU_CLAIM_UID"] == claim["metadata"]["uid"]

    # The pod goes: the kubelet unprepares the claim, the CDI spec goes.
    spec_file = cdi_dir_of(suite, host) / spec_file_name(claim["metadata"]["uid"])
    assert spec_file.exists()
    plugin = plugin_of(suite, host)
    suite.kube.delete(path("v1", "pods", "p1", namespace=namespace))
    wait_for(
        lambda: not spec_file.exists() and plugin.logged("claim unprepared"),
        60,
        "NodeUnprepareResources after the pod's deletion",
        interval=0.3,
        describe=lambda: describe_nodes(suite),
    )


def test_4_an_attach_failure_ends_in_fabric_device_failed_and_the_pod_runs_on_another_block(
    make_suite: MakeSuite, namespace: str
) -> None:
    # The fabric fails the next five attach tasks; the operator retries with backoff, so the
    # first block is still not attached when the scaler's attach timeout (6 s) runs out.
    suite = make_suite(attach_timeout=6, real_hosts=HOSTS)
    suite.emulator.add_fault({"kind": "task_failure", "count": 5, "path": "AddResourceBlock"})
    suite_pod(suite, namespace, "p1")
    wait_for(
        lambda: allocation(suite, namespace, "p1"), 30, "the allocation", describe=suite.describe
    )
    failed_block = result(suite, namespace, "p1")["device"]
    pod = wait_running(suite, namespace, "p1", timeout=90)
    r = result(suite, namespace, "p1")
    assert r["device"] != failed_block
    [status] = suite.claim(namespace, "p1")["status"]["devices"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        names.FABRIC_DEVICE_READY: "True"
    }
    claim_events = suite.kube.get(
        path("v1", "events", namespace=namespace),
        fieldSelector="involvedObject.kind=ResourceClaim,involvedObject.name=p1",
    )["items"]
    assert any(
        e["reason"] == names.FABRIC_DEVICE_FAILED and failed_block in e["message"]
        for e in claim_events
    )
    # Nothing leaks: the failed block is free again, only the new one is composed, and the
    # failed attempt's resource is gone.
    node = pod["spec"]["nodeName"]
    wait_for(
        lambda: suite.composed() == {r["device"]: suite.host_of_node(node)},
        30,
        "only the second block composed",
        describe=suite.describe,
    )
    wait_for(lambda: len(suite.resources()) == 1, 30, "the failed resource to be deleted")
    assert_consistent(suite)
    assert gpu_env(suite, namespace, "p1")["COMPOSABLE_GPU_UUIDS"] == status["data"]["uuid"]


def test_5_a_released_gpu_is_reused_without_a_fabric_call_then_detached_when_idle(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite(no_removal=6, hosts=("node-1",), real_hosts=("node-1",))
    suite_pod(suite, namespace, "p1", run_seconds=1)
    wait_for(
        lambda: suite.pod(namespace, "p1")["status"].get("phase") == "Succeeded",
        60,
        "p1 to run and finish",
        describe=lambda: describe_nodes(suite),
    )
    node = suite.pod(namespace, "p1")["spec"]["nodeName"]
    host = suite.host_of_node(node)
    [cr] = suite.resources()
    block = cr["spec"]["deviceID"]
    uuid = block_uuid(suite, block)
    # Released: attached still, claimRef cleared, published once (as a local device).
    wait_for(
        lambda: uuid in local_uuids(suite, host),
        30,
        "the released GPU to be published as a local device",
        describe=suite.describe,
    )
    [cr] = suite.resources()
    assert cr["spec"].get("claimRef") is None and cr["status"]["phase"] == "Online"
    assert block not in {d for _, d in suite.pool_devices()}
    tasks_before = suite.emulator.state()["tasks"]

    suite_pod(suite, namespace, "p2", node=node, run_seconds=1)
    wait_for(
        lambda: suite.pod(namespace, "p2")["status"].get("phase") in ("Running", "Succeeded"),
        60,
        "p2 to run",
        describe=suite.describe,
    )
    r = result(suite, namespace, "p2")
    assert (r["pool"], r["request"]) == (node, "gpu/local")
    assert suite.emulator.state()["tasks"] == tasks_before  # reused with no fabric call
    assert [c["metadata"]["name"] for c in suite.resources()] == [cr["metadata"]["name"]]

    # After the idle window the GPU is detached and back in the pool.
    wait_for(
        lambda: suite.composed() == {} and suite.resources() == [],
        60,
        "the idle GPU to be detached",
        describe=suite.describe,
    )
    wait_for(
        lambda: (
            block in {d for _, d in suite.pool_devices()} and uuid not in local_uuids(suite, host)
        ),
        30,
        "the block back in the pool and gone from the node",
        describe=suite.describe,
    )


def run_eight_and_a_ninth(suite: Suite, namespace: str, chaos: Callable[[], None] | None) -> None:
    for i in range(8):
        suite_pod(suite, namespace, f"p{i}")
    if chaos is not None:
        chaos()
    for i in range(8):
        wait_running(suite, namespace, f"p{i}", timeout=150)
    devices = [result(suite, namespace, f"p{i}")["device"] for i in range(8)]
    assert len(set(devices)) == 8
    wait_for(lambda: len(suite.composed()) == 8, 30, "8 blocks composed", describe=suite.describe)
    assert_consistent(suite)
    nodes = {suite.pod(namespace, f"p{i}")["spec"]["nodeName"] for i in range(8)}
    assert len(nodes) >= 2

    suite_pod(suite, namespace, "p8")
    wait_for(
        lambda: any(e["reason"] == "FailedScheduling" for e in suite.pod_events(namespace, "p8")),
        60,
        "the 9th pod to wait for a GPU",
    )
    assert suite.pod(namespace, "p8")["status"].get("phase") == "Pending"
    suite.kube.delete(path("v1", "pods", "p0", namespace=namespace))
    wait_running(suite, namespace, "p8", timeout=90)
    assert len(suite.composed()) == 8
    assert_consistent(suite)


def test_3_eight_pods_over_three_nodes_and_eight_pool_gpus(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite(real_hosts=HOSTS)
    run_eight_and_a_ninth(suite, namespace, None)


def test_6_kills_of_scaler_operator_and_plugins_during_eight_pods(
    make_suite: MakeSuite, namespace: str
) -> None:
    # Synchronous composition (with latency) keeps this test short: an operator killed
    # between a 202 and the end of its task leaves the block "Composing" until the emulator
    # ends the task on its own (task_seconds, 10 s), and the retry waits for that. Its nodes
    # are kubelet emulators: what it tests is the controllers and plugins under kills, and
    # a real kubelet's restart back-off after each plugin kill only stretches it past its
    # limits on a loaded machine (tests 2 to 4 run the same flow on real kubelets).
    suite = make_suite(async_polls=0)
    rng = random.Random(6)
    done = threading.Event()
    kills: list[str] = []

    def chaos_loop() -> None:
        targets: list[Any] = [
            suite.scaler,
            suite.operator,
            *(plugin_of(suite, host) for host in HOSTS),
        ]
        for _ in range(5):
            if done.wait(rng.uniform(0.3, 2.5)):
                return
            victim = rng.choice(targets)
            victim.kill()
            kills.append(getattr(victim, "name", None) or victim.node)
            victim.start()

    thread = threading.Thread(target=chaos_loop, daemon=True)

    try:
        run_eight_and_a_ninth(suite, namespace, thread.start)
    finally:
        done.set()
        thread.join(10)
    assert kills, "the chaos loop killed nothing"
