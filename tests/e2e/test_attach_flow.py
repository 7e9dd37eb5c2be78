"""The attach flow end to end (issue 6): real control plane and scheduler, the Redfish
emulator as the fabric, and every component as a process of its own (operator, pool
publisher, scaler, one plugin per node); kubelet emulators in-process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from composable_dra import names
from composable_dra.kube import JSON, Kube
from composable_operator.backend import normalize_uuid
from composable_operator.redfish_backend import RedfishCompositionBackend
from hack.localcluster import ControlPlane
from hack.localcluster.wait import wait_for
from hack.suite import Suite, SuiteOptions

pytestmark = pytest.mark.e2e
MakeSuite = Callable[..., Suite]


@pytest.fixture
def make_suite(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path
) -> Iterator[MakeSuite]:
    suites: list[Suite] = []

    def make(**options: Any) -> Suite:
        suite = Suite(
            kube_json,
            control_plane.kubeconfig,
            short_tmp / f"s{len(suites)}",
            SuiteOptions(**options),
        )
        suites.append(suite)
        return suite.start()

    yield make
    for s in suites:
        s.stop()


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
        describe=lambda: suite.describe() + f"\nclaim: {suite.claim(ns, name).get('status')}",
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
            assert r["spec"]["deviceID"] not in live, f"two resources for {r['spec']['deviceID']}"
            live[r["spec"]["deviceID"]] = r["spec"]["targetNode"]
    assert set(composed) == set(live), (composed, live)
    for block, host in composed.items():
        assert live[block] == suite.node_of(host)


# -- scenarios -----------------------------------------------------------------------------


def test_1_a_free_local_gpu_serves_a_pod_without_any_fabric_call(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite()
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

    suite.create_pod(namespace, "p1")
    wait_running(suite, namespace, "p1")
    r = result(suite, namespace, "p1")
    assert (r["pool"], r["request"]) == (suite.node_of("node-3"), "gpu/local")
    assert suite.pod(namespace, "p1")["spec"]["nodeName"] == suite.node_of("node-3")
    assert suite.resources() == []
    after = suite.emulator.state()
    assert after["blocks"] == before["blocks"]
    assert after["tasks"] == before["tasks"]  # no composition request at all


def test_2_a_pool_gpu_is_attached_to_the_chosen_node_in_one_scheduling_cycle(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite()
    suite.create_pod(namespace, "p1")
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
    prepared = [
        ids
        for n in suite.nodes.values()
        for ids in n.kubelet.prepared_devices(pod["metadata"]["uid"]).values()
    ]
    assert prepared and prepared[0]
