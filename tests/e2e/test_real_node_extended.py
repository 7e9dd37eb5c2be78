"""A pod that asks for a GPU as an extended resource (``resources.limits:
{example.com/gpu: 1}``) and has no ResourceClaim gets a GPU of this suite, on a real node
(the upstream kubelet v1.37.1, containerd, runc).

The chart's extended-resource DeviceClass (``extendedResource.name``) maps the name;
kube-scheduler v1.37.1 makes the pod's claim itself (DRAExtendedResource, GA and locked
on): one ExactCount request per asking container, no firstAvailable, owned by the pod.
What this shows of that scheduler:

- the claim can take a pool device with binding conditions: the GPU is attached in one
  scheduling cycle (``FabricDeviceReady``), the time to GPU printed;
- the same claim shape takes a GPU already on the node (here the one that pod released,
  as a standby GPU would be) with no binding condition and no fabric call: pools without
  binding conditions are tried first;
- only the container that asks gets the CDI device; the scaler's idle rule keeps the GPU
  while such a claim holds it and returns it to the pool once the pod is gone;
- a second class mapping the same name, created later, takes the name over: the pool
  publisher posts a Warning Event naming both classes; once that class is deleted, the
  scheduler would map the name to no class until ours changes (an upstream quirk), so the
  publisher touches ours and the next pod is scheduled.

``example.com/gpu`` is a test-only name that nothing else in the cluster maps.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from composable_dra.model.names import ANN_IN_USE_BY, normalize_uuid
from pool_publisher.class_clash import REFRESHED
from testbed import chart
from testbed.harness import Suite
from testbed.objects import NO_IMAGE
from testbed.realnode_pods import for_real_node
from testbed.realnodes import describe_nodes, gone, wait_output
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite
from tests.e2e.test_attach_flow import block_uuid, local_uuids

pytestmark = pytest.mark.e2e
RESOURCE = "resource.k8s.io/v1"
NAME = "example.com/gpu"
EXTENDED_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
PRINT_AND_WAIT = "env; echo READY; exec sleep 3600"


@pytest.fixture
def extended_class(kube_json: Kube, unique: str) -> Iterator[JSON]:
    """The chart's extended-resource DeviceClass for NAME, as the chart renders it."""
    values = {"extendedResource": {"name": NAME, "className": f"ext-{unique}"}}
    rendered = chart.render(values=values)
    [dc] = [
        o for o in rendered if o["kind"] == "DeviceClass" and o["spec"].get("extendedResourceName")
    ]
    assert dc["metadata"]["name"] == f"ext-{unique}"
    created: JSON = kube_json.create(path(RESOURCE, "deviceclasses"), dc)
    yield created
    kube_json.delete(path(RESOURCE, "deviceclasses", dc["metadata"]["name"]))


def two_container_pod(suite: Suite, name: str) -> JSON:
    """Container ``gpu`` asks for one NAME; container ``other`` asks for nothing."""
    pod = {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "gpu",
                    "command": ["sh", "-c", PRINT_AND_WAIT],
                    "resources": {"limits": {NAME: "1"}},
                },
                {"name": "other", "command": ["sh", "-c", PRINT_AND_WAIT]},
            ],
        },
    }
    [real] = suite.real_nodes.values()
    return for_real_node(pod, real.name, real.image)


def container_env(suite: Suite, namespace: str, pod: str, container: str) -> dict[str, str]:
    [real] = suite.real_nodes.values()
    out = wait_output(real, namespace, pod, "READY", container=container)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def run_pod(suite: Suite, namespace: str, name: str) -> tuple[JSON, JSON, float]:
    """Create the pod; once it runs: the pod, the claim the scheduler made, time to GPU."""
    start = time.monotonic()
    suite.kube.create(path("v1", "pods", namespace=namespace), two_container_pod(suite, name))
    wait_for(
        lambda: suite.running(namespace, name),
        90,
        f"pod {name} to run",
        interval=0.2,
        describe=lambda: f"{suite.pod(namespace, name).get('status')}\n{describe_nodes(suite)}",
    )
    elapsed = time.monotonic() - start
    pod = suite.pod(namespace, name)
    claim_name = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    return pod, suite.claim(namespace, claim_name), elapsed


def assert_scheduler_claim(pod: JSON, claim: JSON) -> JSON:
    """The claim is the scheduler's: annotated, owned by the pod, one ExactCount request
    for the asking container; its one result."""
    meta = claim["metadata"]
    assert meta["annotations"][EXTENDED_ANNOTATION] == "true"
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "Pod",
        pod["metadata"]["uid"],
        True,
    )
    [request] = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["count"] == 1
    assert "firstAvailable" not in request
    assert pod["status"]["extendedResourceClaimStatus"]["requestMappings"] == [
        {"containerName": "gpu", "resourceName": NAME, "requestName": request["name"]}
    ]
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


def assert_only_gpu_container_has(suite: Suite, namespace: str, pod: str, uuid: str) -> None:
    env = container_env(suite, namespace, pod, "gpu")
    assert normalize_uuid(env["COMPOSABLE_GPU_UUIDS"]) == uuid
    other = container_env(suite, namespace, pod, "other")
    assert not {k for k in other if k.startswith("COMPOSABLE_GPU") or k == "NVIDIA_VISIBLE_DEVICES"}


def delete_pod(suite: Suite, namespace: str, pod: str, claim: JSON) -> None:
    """The pod goes, and with it (garbage collection: the pod owns it) its claim."""
    suite.kube.delete(path("v1", "pods", pod, namespace=namespace))
    claim_path = path(RESOURCE, "resourceclaims", claim["metadata"]["name"], namespace=namespace)
    wait_for(gone(suite.kube, claim_path), 60, f"the claim of {pod} to go", describe=suite.describe)


def in_use_by(suite: Suite) -> str | None:
    [cr] = suite.resources()
    return (cr["metadata"].get("annotations") or {}).get(ANN_IN_USE_BY)


def assert_clash_event(suite: Suite, ours: str, theirs: str) -> None:
    """The publisher's Warning Event, on whichever class the scheduler ignores (created in
    the same second, the name sorted first wins), names both."""

    def event() -> JSON | None:
        items = suite.kube.get(
            path("v1", "events", namespace="default"),
            fieldSelector="involvedObject.kind=DeviceClass,reason=ExtendedResourceClash",
        )["items"]
        return next((e for e in items if e["involvedObject"]["name"] in (ours, theirs)), None)

    found: JSON = wait_for(event, 30, "the publisher's ExtendedResourceClash event")
    assert found["type"] == "Warning"
    assert ours in found["message"] and theirs in found["message"]


# Long because it reads top to bottom: pool attach, release, reuse on the node, detach.
@pytest.mark.versions("1.36")
def test_an_extended_resource_pod_gets_a_pool_gpu_then_the_released_one(
    make_suite: MakeSuite, namespace: str, extended_class: JSON, unique: str
) -> None:
    suite = make_suite(no_removal=6, hosts=("node-1",), real_hosts=("node-1",))
    node = suite.node_of("node-1")

    # 1. No GPU on the node: the scheduler's claim takes a pool device, attached in one cycle.
    pod, claim, pool_seconds = run_pod(suite, namespace, "pooled")
    result = assert_scheduler_claim(pod, claim)
    assert "/" in result["pool"]  # a fabric pool, <fabric>/<zone>
    assert result["bindingConditions"] == [names.FABRIC_DEVICE_READY]
    [status] = claim["status"]["devices"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        names.FABRIC_DEVICE_READY: "True"
    }
    [cr] = suite.resources()
    assert cr["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    assert cr["spec"]["targetNode"] == node
    uuid = block_uuid(suite, result["device"])
    assert_only_gpu_container_has(suite, namespace, "pooled", uuid)
    reasons = [e["reason"] for e in suite.pod_events(namespace, "pooled")]
    assert "BindingConditionsPending" in reasons and "FailedScheduling" not in reasons
    print(f"time to GPU, extended resource, pool attach: {pool_seconds:.1f} s", flush=True)

    # 2. The pod goes: its claim with it; the GPU is released, idle on the node.
    delete_pod(suite, namespace, "pooled", claim)
    wait_for(lambda: uuid in local_uuids(suite, "node-1"), 30, "the GPU released to the node")
    tasks = suite.emulator.state()["tasks"]

    # 3. The same request now takes the GPU on the node: no binding condition, no fabric call.
    pod, claim, local_seconds = run_pod(suite, namespace, "local")
    result = assert_scheduler_claim(pod, claim)
    assert result["pool"] == node
    assert not result.get("bindingConditions")
    assert suite.emulator.state()["tasks"] == tasks
    assert_only_gpu_container_has(suite, namespace, "local", uuid)
    print(f"time to GPU, extended resource, GPU on the node: {local_seconds:.1f} s", flush=True)

    # 4. The idle rule counts the scheduler's claim: it marks the GPU in use by it, and
    # once the pod is gone the GPU goes back to the pool after the idle window.
    wait_for(
        lambda: in_use_by(suite) == claim["metadata"]["uid"],
        30,
        "the idle rule to mark the GPU in use by the scheduler's claim",
        describe=suite.describe,
    )
    delete_pod(suite, namespace, "local", claim)
    wait_for(
        lambda: suite.composed() == {} and suite.resources() == [],
        60,
        "the idle GPU detached",
        describe=suite.describe,
    )


def asking_pod(suite: Suite, namespace: str, name: str) -> None:
    """A pod (on the suite's emulated node) whose one container asks for one NAME."""
    container = {"name": "gpu", "image": NO_IMAGE, "resources": {"limits": {NAME: "1"}}}
    pod = suite.on_own_nodes({"metadata": {"name": name}, "spec": {"containers": [container]}})
    suite.kube.create(path("v1", "pods", namespace=namespace), pod)


def wait_scheduled(suite: Suite, namespace: str, name: str) -> None:
    wait_for(
        lambda: bool(suite.pod(namespace, name)["spec"].get("nodeName")),
        30,
        f"pod {name} to be scheduled",
        describe=lambda: str(suite.pod_events(namespace, name)),
    )


def wait_unschedulable(suite: Suite, namespace: str, name: str) -> str:
    def message() -> str | None:
        events = suite.pod_events(namespace, name)
        return next((e["message"] for e in events if e["reason"] == "FailedScheduling"), None)

    found: str = wait_for(message, 30, f"pod {name} to fail scheduling")
    assert not suite.pod(namespace, name)["spec"].get("nodeName")
    return found


# Long because it reads top to bottom: the takeover, the warning, and the scheduler's cache after.
def test_a_later_class_that_maps_the_name_takes_it_over_and_the_publisher_warns(
    make_suite: MakeSuite, namespace: str, extended_class: JSON, unique: str
) -> None:
    """kube-scheduler v1.37.1 with two classes for one name: the newer one serves every
    pod that asks for it, and the pool publisher says so. The node is a kubelet emulator:
    what matters here is where the scheduler puts the pod, not what runs."""
    suite = make_suite(hosts=("node-1",))
    ours = extended_class["metadata"]["name"]
    asking_pod(suite, namespace, "before")
    wait_scheduled(suite, namespace, "before")  # ours maps NAME: a GPU of ours

    # Another driver's class for the same name, created later (the suite's start took
    # seconds): it takes the name over; its driver publishes nothing, so pods now wait.
    other = f"vendor-{unique}"
    theirs: JSON = {
        "metadata": {"name": other},
        "spec": {
            "extendedResourceName": NAME,
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}],
        },
    }
    created = suite.kube.create(path(RESOURCE, "deviceclasses"), theirs)
    assert (
        created["metadata"]["creationTimestamp"] > extended_class["metadata"]["creationTimestamp"]
    )
    try:
        assert_clash_event(suite, ours, other)
        asking_pod(suite, namespace, "taken-over")
        wait_unschedulable(suite, namespace, "taken-over")
    finally:
        suite.kube.delete(path(RESOURCE, "deviceclasses", other))

    # Theirs gone: kube-scheduler v1.37.1's cache drops the name with it, ours too
    # (removeResourceName2class); the publisher touches ours, and the name is ours again.
    def refreshed() -> bool:
        got = suite.kube.get(path(RESOURCE, "deviceclasses", ours))
        return REFRESHED in (got["metadata"].get("annotations") or {})

    wait_for(refreshed, 30, "the publisher to touch our class")
    asking_pod(suite, namespace, "after-delete")
    wait_scheduled(suite, namespace, "after-delete")
