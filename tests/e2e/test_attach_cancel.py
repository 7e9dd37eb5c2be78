"""Resources deleted mid-attach, and adopted orphans, end to end: the real
control plane, the Redfish emulator as the fabric, the operator, pool publisher, scaler
and plugins each a process of their own (testbed/harness.py); the node each
test attaches to is a real node (the upstream kubelet, containerd, runc), the others
kubelet emulators.

Each cancellation ends with the block back in the pool, no ComposableResource left and
no block composed to any host, once every fabric task has ended (a late attach must not
land behind the detach's back).
"""

from __future__ import annotations

import time

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.fabric.redfish import RedfishCompositionBackend
from composable_dra.k8s.kube import JSON, path
from composable_dra.model import names
from composable_operator.fabric_status import ADOPTED
from dra_driver.device_source import device_name_for
from testbed import objects
from testbed.harness import Suite
from testbed.realnodes import plugin_of, suite_pod
from testbed.wait import wait_for
from testbed.wake import touches
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e
RESOURCES = path(API_VERSION, "composableresources")
ATTACH_POST = r"/Actions/ComputerSystem\.AddResourceBlock$"
DETACH_POST = r"/Actions/ComputerSystem\.RemoveResourceBlock$"
REAL = ("node-1",)  # the host these tests attach to


def block_for(suite: Suite, host: str) -> str:
    """A free block that the host's zones reach."""
    state = suite.emulator.state()
    zones = set(state["systems"][host]["zones"])
    return min(
        str(b) for b, s in state["blocks"].items() if s["zone"] in zones and s["state"] == "Unused"
    )


def create_resource(suite: Suite, name: str, block: str, host: str) -> None:
    objects.create_resource(suite.kube, name, suite.fabric, block, suite.node_of(host))


def resource(suite: Suite, name: str) -> JSON | None:
    return suite.kube.get_or_none(path(API_VERSION, "composableresources", name))


def delete_resource(suite: Suite, name: str) -> float:
    suite.kube.delete(path(API_VERSION, "composableresources", name))
    return time.monotonic()


def fired(suite: Suite, rule_id: str) -> int:
    return next(int(r.get("fired", 0)) for r in suite.emulator.faults() if r["id"] == rule_id)


def wait_pooled(suite: Suite, blocks: set[str]) -> None:
    wait_for(
        lambda: blocks <= {d for _, d in suite.pool_devices()},
        30,
        f"{sorted(blocks)} back in the pool",
        describe=suite.describe,
    )


def assert_back_in_pool(suite: Suite, block: str, deadline: float = 60) -> None:
    """No resource left; every fabric task ended; nothing composed; the block published."""

    def quiet() -> bool:
        state = suite.emulator.state()
        return (
            not suite.resources()
            and bool(state["tasks"])
            and all(t != "Running" for t in state["tasks"].values())
            and state["blocks"][block]["state"] != "Composing"
        )

    wait_for(
        quiet, deadline, "the resource gone and every fabric task ended", describe=suite.describe
    )
    assert suite.composed() == {}, f"left composed with no resource: {suite.describe()}"
    assert suite.emulator.state()["blocks"][block]["state"] == "Unused"
    wait_pooled(suite, {block})


def test_deleted_while_the_attach_request_is_on_its_way_to_the_fabric(
    make_suite: MakeSuite, unique: str
) -> None:
    # The case: the attach request is sent but the fabric has not acted on it yet
    # (latency), so a fresh read shows the block free; it lands after the deletion.
    suite = make_suite(attach_latency=0, real_hosts=REAL)
    rule = suite.emulator.add_fault(
        {"kind": "latency", "method": "POST", "path": ATTACH_POST, "latency": 2.5, "count": 1}
    )
    block = block_for(suite, "node-1")
    name = f"cancel-a-{unique}"
    create_resource(suite, name, block, "node-1")
    wait_for(lambda: fired(suite, rule["id"]) >= 1, 30, "the attach request to reach the fabric")
    assert suite.emulator.state()["blocks"][block]["state"] == "Unused"
    delete_resource(suite, name)
    assert_back_in_pool(suite, block)


def test_deleted_while_the_fabric_task_runs(make_suite: MakeSuite, unique: str) -> None:
    # The task runs while it is polled (3 polls, a second apart) and would otherwise end on
    # its own only after 40 s: the detach follows it, so the block is back well before.
    suite = make_suite(attach_latency=0, async_polls=3, retry_after=1, real_hosts=REAL)
    suite.emulator.configure(task_seconds=40)
    block = block_for(suite, "node-1")
    name = f"cancel-b-{unique}"
    create_resource(suite, name, block, "node-1")
    wait_for(
        lambda: suite.emulator.state()["blocks"][block]["state"] == "Composing",
        30,
        "the attach task to start",
        interval=0.05,
    )
    deleted = delete_resource(suite, name)
    assert_back_in_pool(suite, block, deadline=25)
    assert time.monotonic() - deleted < 25


def test_deleted_after_the_task_completed_but_before_online(
    make_suite: MakeSuite, unique: str
) -> None:
    # node-1's plugin is stopped, so the device is attached but never reported visible: the
    # resource waits in Attaching with its UUID recorded.
    suite = make_suite(attach_latency=0, real_hosts=REAL)
    plugin_of(suite, "node-1").stop()
    block = block_for(suite, "node-1")
    name = f"cancel-c-{unique}"
    create_resource(suite, name, block, "node-1")
    wait_for(
        lambda: ((resource(suite, name) or {}).get("status") or {}).get("deviceUUID"),
        30,
        "the attach to complete",
        describe=suite.describe,
    )
    assert suite.composed() == {block: "node-1"}
    assert resource(suite, name)["status"]["phase"] == "Attaching"  # type: ignore[index]
    delete_resource(suite, name)
    # The host holds the GPU (attached to it), so the detach asks its plugin first and,
    # the node being Ready, waits for it (docs/operations.md, Safe detach); the restarted
    # plugin releases it.
    wait_for(
        lambda: release_requested(resource(suite, name)),
        30,
        "the detach to ask node-1's host to release the GPU",
        describe=suite.describe,
    )
    plugin_of(suite, "node-1").start()
    assert_back_in_pool(suite, block)


def release_requested(r: JSON | None) -> bool:
    conditions = ((r or {}).get("status") or {}).get("conditions") or []
    return any(
        c.get("type") == names.RELEASE_REQUESTED and c.get("status") == "True" for c in conditions
    )


def attach_followed(make_suite: MakeSuite, name: str) -> tuple[Suite, str]:
    """A suite whose attach tasks end on their own only after 40 s, unless polled (3 polls,
    a second apart); resource ``name`` for a free block of node-1, whose attach task the
    operator follows. (suite, block)"""
    suite = make_suite(attach_latency=0, async_polls=3, retry_after=1, real_hosts=REAL)
    suite.emulator.configure(task_seconds=40)
    # A rule that changes nothing noticeable: it counts the polls of task monitors.
    polls = suite.emulator.add_fault(
        {"kind": "latency", "method": "GET", "path": "/TaskMonitors/", "latency": 0.01}
    )
    block = block_for(suite, "node-1")
    create_resource(suite, name, block, "node-1")
    wait_for(lambda: fired(suite, polls["id"]) >= 1, 30, "the operator to follow the task")
    return suite, block


def test_deleted_while_the_fabric_task_runs_and_the_operator_is_down(
    make_suite: MakeSuite, unique: str
) -> None:
    # The operator dies while it follows the attach task, and the resource is deleted while
    # it is down: the restarted operator finds the task again in status.pendingAttach and
    # follows it, rather than wait for the fabric to end it on its own (40 s).
    name = f"cancel-d-{unique}"
    suite, block = attach_followed(make_suite, name)
    assert suite.emulator.state()["blocks"][block]["state"] == "Composing"
    assert suite.operator is not None
    suite.operator.kill()
    deleted = delete_resource(suite, name)
    suite.operator.start()
    assert_back_in_pool(suite, block, deadline=30)
    assert time.monotonic() - deleted < 30


def test_a_restarted_operator_follows_the_attach_task_it_had_recorded(
    make_suite: MakeSuite, unique: str
) -> None:
    # Not deleted this time: the restarted operator's daemon follows the recorded task, so
    # the resource goes Online long before the fabric would end the task on its own (40 s).
    name = f"restart-{unique}"
    suite, block = attach_followed(make_suite, name)
    assert suite.operator is not None
    suite.operator.kill()
    killed = time.monotonic()
    suite.operator.start()
    wait_for(
        lambda: ((resource(suite, name) or {}).get("status") or {}).get("phase") == "Online",
        30,
        "the resource to go Online",
        describe=suite.describe,
    )
    assert time.monotonic() - killed < 30
    assert suite.composed() == {block: "node-1"}
    wait_for(
        lambda: "pendingAttach" not in ((resource(suite, name) or {}).get("status") or {}),
        10,
        "the record of the ended task to go",
    )


def test_an_out_of_band_attach_is_adopted_then_returned_to_the_pool_when_idle(
    make_suite: MakeSuite,
) -> None:
    suite = make_suite(no_removal=4, real_hosts=("node-3",))
    suite.kube.merge_patch(
        path(API_VERSION, "fabrics", suite.fabric), {"spec": {"orphanGracePeriodSeconds": 0}}
    )
    block = block_for(suite, "node-3")
    # An administrator attaches a block through the fabric's own API, behind our back.
    backend = RedfishCompositionBackend(
        suite.emulator.url, suite.emulator.user, suite.emulator.password
    )
    try:
        op = backend.attach(block, "node-3")
        wait_for(
            lambda: op is None or backend.operation_status(op).state == "done",
            30,
            "the out-of-band attach",
        )
    finally:
        backend.close()
    adopted = wait_for(
        lambda: next(
            (
                r
                for r in suite.resources()
                if (r["metadata"].get("annotations") or {}).get(ADOPTED) == "adopt"
            ),
            None,
        ),
        60,
        "the operator to adopt the orphan",
        describe=suite.describe,
    )
    assert adopted["spec"]["deviceID"] == block
    assert adopted["spec"]["targetNode"] == suite.node_of("node-3")
    # Idle from the start: the scaler's idle rule detaches it after the window (4 s).
    wait_for(
        lambda: not suite.resources() and suite.composed() == {},
        60,
        "the adopted orphan to be detached when idle",
        describe=suite.describe,
    )
    wait_pooled(suite, {block})


def attaching(suite: Suite, namespace: str, pods: list[str], latency: str) -> None:
    """Pods with their own claims, once each one's attach request has reached the fabric
    (held there by the latency rule ``latency``)."""
    before = fired(suite, latency)
    for p in pods:
        suite_pod(suite, namespace, p)
    wait_for(
        lambda: fired(suite, latency) >= before + len(pods),
        60,
        "every attach request to reach the fabric",
        describe=suite.describe,
    )


def test_pods_and_claims_deleted_while_their_gpus_attach(
    make_suite: MakeSuite, namespace: str
) -> None:
    # The probe: pool GPUs attach slowly (here 5 s of latency); the pods and their claims
    # are deleted once every attach request has reached the fabric.
    suite = make_suite(attach_latency=5, real_hosts=REAL)
    [latency] = [r for r in suite.emulator.faults() if r["kind"] == "latency"]
    pods = [f"p{i}" for i in range(4)]
    attaching(suite, namespace, pods, latency["id"])
    blocks = {r["spec"]["deviceID"] for r in suite.resources()}
    assert len(blocks) == len(pods)
    for p in pods:
        suite.kube.delete(path("v1", "pods", p, namespace=namespace))
        suite.kube.delete(path("resource.k8s.io/v1", "resourceclaims", p, namespace=namespace))

    def quiet() -> bool:
        # Every attach request has become a task (none is still on its way), all ended.
        tasks = suite.emulator.state()["tasks"]
        return (
            not suite.resources()
            and len(tasks) >= len(pods)
            and all(t != "Running" for t in tasks.values())
        )

    wait_for(quiet, 60, "every resource gone and every task ended", describe=suite.describe)
    assert suite.composed() == {}, f"left composed with no resource: {suite.describe()}"
    wait_pooled(suite, blocks)


def test_pods_waiting_for_a_gpu_run_once_cancelled_attaches_free_theirs(
    make_suite: MakeSuite, namespace: str
) -> None:
    # Issue 25, item 0: 8 pool pods on the 8 pool GPUs (attach latency 1.5 s), 4 of them
    # deleted with their claims as their GPUs start to attach, and 4 new pods created at
    # once. kube-scheduler holds each cancelled allocation in flight until its
    # next binding-condition check, 5 s after the pod began to wait: after the GPUs are
    # back in the pool (about 3 s), so the pool's rewrite wakes the new pods too early,
    # and no event follows the release; without a wake-up they waited for the 5 min flush
    # of unschedulable pods. The pool publisher touches each affected pool once. (The
    # latency is the attach request's only: a detach as slow would bring the GPUs back
    # after the release on a loaded machine, and their rewrite would wake the pods.)
    suite = make_suite(attach_latency=0, real_hosts=REAL)
    latency = suite.emulator.add_fault(
        {"kind": "latency", "method": "POST", "path": ATTACH_POST, "latency": 1.5}
    )["id"]
    kept, cancelled = [f"p{i}" for i in range(4)], [f"c{i}" for i in range(4)]
    attaching(suite, namespace, kept, latency)
    attaching(suite, namespace, cancelled, latency)
    assert not any(suite.pod(namespace, c)["spec"].get("nodeName") for c in cancelled)
    blocks = {
        r["spec"]["deviceID"]
        for r in suite.resources()
        if r["spec"]["claimRef"]["name"] in cancelled
    }
    for p in cancelled:
        suite.kube.delete(path("v1", "pods", p, namespace=namespace), gracePeriodSeconds=0)
        suite.kube.delete(path("resource.k8s.io/v1", "resourceclaims", p, namespace=namespace))
    later = [f"q{i}" for i in range(4)]
    for q in later:
        # Local first, then the pool, as the pods: a cancelled GPU is never a local
        # device, even while a plugin's list still shows it (the test above holds that
        # race open).
        suite_pod(suite, namespace, q)
    wait_pooled(suite, blocks)
    freed = time.monotonic()
    pods = [*later, *kept]
    wait_for(
        lambda: all(suite.running(namespace, p) for p in pods),
        30,
        "every pod of the sequence to run within 30 s of the GPUs being free",
        describe=suite.describe,
    )
    print(f"every pod ran {time.monotonic() - freed:.1f} s after the GPUs were back in the pool")
    assert suite.publisher is not None
    # The extra slice writes: at most one per pool the cancellations touched.
    made = touches(suite.publisher)
    print(f"wake-up touches: {len(made)}")
    assert len(made) <= len({suite.emulator.state()["blocks"][b]["zone"] for b in blocks})


def listed(suite: Suite, host: str, device: str) -> bool:
    """Whether the device source of ``host``'s plugin last listed ``device``."""
    lists = [
        e.get("devices") or []
        for e in suite.nodes[host].plugin.process.log_events(current_only=True)
        if e.get("event") == "devices changed"
    ]
    return bool(lists) and device in lists[-1]  # type: ignore[operator]


def held_back(suite: Suite, host: str, device: str) -> bool:
    """Whether ``host``'s plugin kept ``device`` out of its slice: for want of a fresh read,
    or as leaving the node (its resource was seen detaching: with the host release, the
    plugin looks at the resource while it waits for the detach)."""
    return any(
        e.get("event") in ("devices not added", "devices held back")
        and device in (e.get("devices") or [])  # type: ignore[operator]
        for e in suite.nodes[host].plugin.process.log_events(current_only=True)
    )


def test_a_cancelled_attach_gpu_is_never_allocated_as_a_local_device(
    make_suite: MakeSuite, namespace: str
) -> None:
    # The race behind issue 25 item 0's stuck prefer-local pods, held open. A pool attach
    # is cancelled as its request reaches the fabric; its GPU lands on node-2, whose plugin
    # lists it while the detach request is held (latency); then that plugin's reads of its
    # GPUs fail, so its list stays the one read before the detach (as when its next poll
    # has not come round yet) while the resource goes and prefer-local pods arrive. The
    # GPU must never be one of node-2's local devices: a pod allocated it would fail
    # prepare ('not present on node') for ever.
    suite = make_suite(attach_latency=0)
    host, node = "node-2", suite.node_of("node-2")
    slow_attach = suite.emulator.add_fault(
        {"kind": "latency", "method": "POST", "path": ATTACH_POST, "latency": 1.5, "count": 1}
    )
    slow_detach = suite.emulator.add_fault(
        {"kind": "latency", "method": "POST", "path": DETACH_POST, "latency": 5, "count": 1}
    )
    suite.create_pod(namespace, "c0", node=node, local_first=False)
    wait_for(
        lambda: fired(suite, slow_attach["id"]) >= 1, 60, "the attach request to reach the fabric"
    )
    [cancelled] = suite.resources()
    block = cancelled["spec"]["deviceID"]
    gpu = device_name_for(suite.emulator.state()["blocks"][block]["uuid"])
    suite.kube.delete(path("v1", "pods", "c0", namespace=namespace), gracePeriodSeconds=0)
    suite.kube.delete(path("resource.k8s.io/v1", "resourceclaims", "c0", namespace=namespace))
    wait_for(
        lambda: fired(suite, slow_detach["id"]) >= 1, 60, "the detach request to reach the fabric"
    )
    wait_for(lambda: listed(suite, host, gpu), 10, f"{host}'s plugin to list {gpu}")
    suite.emulator.add_fault(
        {"kind": "status500", "method": "GET", "path": f"/Systems/{host}/Processors"}
    )
    assert suite.composed().get(block) == host, "the detach landed before the list was held"
    wait_for(lambda: not suite.resources(), 60, "the cancelled attach's resource to go")
    assert block not in suite.composed()

    def local() -> set[str]:
        return {d["name"] for d in suite.local_devices(host)}

    wait_for(
        lambda: gpu in local() or held_back(suite, host, gpu),
        30,
        f"{host}'s plugin to decide on {gpu} once its resource is gone",
        describe=suite.describe,
    )
    assert gpu not in local(), f"the detached {gpu} is a local device of {host}"
    later = [f"q{i}" for i in range(2)]
    for q in later:
        suite.create_pod(namespace, q, node=node)  # local first, then the pool
    wait_for(
        lambda: all(suite.claim(namespace, q).get("status", {}).get("allocation") for q in later),
        60,
        "the prefer-local claims to be allocated",
        describe=suite.describe,
    )
    allocated = [
        r["device"]
        for q in later
        for r in suite.claim(namespace, q)["status"]["allocation"]["devices"]["results"]
    ]
    assert gpu not in allocated, f"the detached {gpu} was allocated as a local device"
    suite.emulator.set_faults([])  # the plugin reads its GPUs again
    wait_for(
        lambda: all(suite.running(namespace, q) for q in later),
        60,
        "every prefer-local pod to run",
        describe=suite.describe,
    )
    log = suite.nodes[host].plugin.log_path.read_text(errors="replace")
    assert "is not present on node" not in log
