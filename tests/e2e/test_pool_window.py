"""A pool offers a window of its zone's free GPUs (``--max-free-devices-per-pool``) and
refills it as claims take them: more pool claims at once than the window holds all get a
GPU, and the pool never offers more free devices than the window. By default the window
sizes itself to the pending claims (pool_publisher/window.py).

The window keeps the scheduler's cost per pod down: it evaluates every free pool device
against a claim's selectors on every node it filters (docs/attach-flow.md, Scale).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from hack.bench.time_to_gpu import topology
from pool_publisher.window import MARGIN, MIN_WINDOW, pending_claims
from testbed.harness import Suite
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e
RESOURCE = "resource.k8s.io/v1"

HOSTS = ("node-1", "node-2")  # time_to_gpu.topology's names
WINDOW = 2
BLOCKS = 8
CLAIMS = 5  # more than the window: the pool must be refilled


def free_devices(slices: Iterable[JSON]) -> set[str]:
    """Pool devices without the allocated taint."""
    return {
        d["name"]
        for s in slices
        for d in s["spec"].get("devices") or []
        if not any(t.get("key") == f"{names.PREFIX}/allocated" for t in d.get("taints") or [])
    }


def free_in_pool(suite: Suite) -> set[str]:
    return free_devices(suite.pool_slices())


def waiting_pool_claims(suite: Suite) -> list[str]:
    """namespace/name of every claim in the cluster that waits for a class of ours."""
    ours = {names.DEVICE_CLASS, names.LOCAL_DEVICE_CLASS}
    claims = suite.kube.get(path(RESOURCE, "resourceclaims")).get("items") or []
    return [
        f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        for c in claims
        if pending_claims([c], ours)
    ]


def claims_all_served(suite: Suite, namespace: str, claims: int) -> list[set[str]]:
    """Pods with pool claims at once, every one running on a pool GPU of its own; the free
    devices the pool offered after each write of its slices while they were scheduled
    (from a watch: a window the scheduler empties within milliseconds is seen too)."""
    seen: list[set[str]] = []
    latest: dict[str, JSON] = {}

    def on_event(kind: str, obj: JSON) -> None:
        if kind == "DELETED":
            latest.pop(obj["metadata"]["name"], None)
        else:
            latest[obj["metadata"]["name"]] = obj
        seen.append(free_devices(latest.values()))

    watch = Informer(
        suite.kube,
        path(RESOURCE, "resourceslices"),
        on_event=on_event,
        name="pool-window",
        labelSelector=f"{names.LABEL_FABRIC}={suite.fabric}",
    )
    watch.start()
    assert watch.synced.wait(30), "the pool slices were not listed within 30 s"
    pods = [f"p{i}" for i in range(claims)]
    try:
        for p in pods:
            suite.create_pod(namespace, p, local_first=False)
        wait_for(
            lambda: all(suite.running(namespace, p) for p in pods),
            150,
            "every pod running on a pool GPU",
            describe=suite.describe,
        )
    finally:
        watch.stop()
    # Every claim has a fabric pool GPU of its own.
    blocks = set()
    for p in pods:
        claim = suite.claim(namespace, p)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert "/" in result["pool"]
        blocks.add(result["device"])
    assert len(blocks) == claims
    assert set(suite.composed()) >= blocks
    return seen


def test_more_pool_claims_than_the_window_all_get_a_gpu(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite(
        hosts=HOSTS,
        topology=topology(len(HOSTS), BLOCKS),
        attach_latency=0,
        publisher_args=[f"--max-free-devices-per-pool={WINDOW}"],
    )
    wait_for(lambda: free_in_pool(suite) == {"gpu-1", "gpu-2"}, 30, "the first window")
    seen = claims_all_served(suite, namespace, CLAIMS)
    assert seen and max(len(free) for free in seen) <= WINDOW


def test_the_default_window_grows_with_the_pending_claims(
    make_suite: MakeSuite, kube_json: Kube, namespace: str
) -> None:
    # The publisher's default (auto): MIN_WINDOW free devices with nothing pending; more
    # claims at once than that, in one zone, all get a GPU.
    blocks = MIN_WINDOW + MARGIN + 4
    # A claim of another driver's class waits from before the publisher starts (its first
    # pass sees it): no demand on the pool, the window stays at its minimum.
    other = {"name": "gpu", "exactly": {"deviceClassName": "another-vendors-gpu"}}
    kube_json.create(
        path(RESOURCE, "resourceclaims", namespace=namespace),
        {"metadata": {"name": "not-ours"}, "spec": {"devices": {"requests": [other]}}},
    )
    suite = make_suite(hosts=HOSTS, topology=topology(len(HOSTS), blocks), attach_latency=0)
    # The control plane is shared: a pool claim another test left waiting (its namespace
    # still being deleted) is demand this publisher rightly counts. Wait it out first.
    wait_for(
        lambda: not waiting_pool_claims(suite),
        120,
        "no pool claim of other tests waiting",
        describe=lambda: str(waiting_pool_claims(suite)),
    )
    wait_for(
        lambda: len(free_in_pool(suite)) == MIN_WINDOW,
        30,
        "the smallest window",
        describe=lambda: f"{sorted(free_in_pool(suite))}; waiting: {waiting_pool_claims(suite)}",
    )
    claims = MIN_WINDOW + 2
    seen = claims_all_served(suite, namespace, claims)
    # Pending claims grew the window past its minimum (their share and the margin).
    assert max(len(free) for free in seen) > MIN_WINDOW
