"""A detached GPU leaves its node's slice before its block is back in the pool, end to
end: the real control plane, the Redfish emulator, the operator, pool publisher, scaler
and plugins each a process of their own (hack/suite.py).

The plugins poll the fabric every 6 s here, so a detached GPU stays in its node's slice
for seconds after the fabric let it go. The detach must keep its taint until the slice
drops the device: the resource's end puts the block back in the pool, and the stale
local device, untainted, could then be allocated (a GPU that is gone, or one GPU twice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra import names
from composable_dra.kube import JSON, Kube, path
from composable_operator.backend import normalize_uuid
from hack.localcluster import ControlPlane
from hack.localcluster.wait import wait_for
from hack.suite import RESOURCE, Suite, SuiteOptions

pytestmark = pytest.mark.e2e
MakeSuite = Callable[..., Suite]
PLUGIN_POLL = 6.0


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


def local_refs(suite: Suite, host: str, uuid: str) -> set[tuple[str, str]]:
    """(pool, device) of every device in the node's own slices with this GPU's UUID."""
    slices = suite.kube.get(
        path(RESOURCE, "resourceslices"),
        fieldSelector=f"spec.nodeName={suite.node_of(host)},spec.driver={names.DRIVER}",
    )["items"]
    return {
        (s["spec"]["pool"]["name"], d["name"])
        for s in slices
        for d in s["spec"].get("devices", [])
        if normalize_uuid(d.get("attributes", {}).get("uuid", {}).get("string", "")) == uuid
    }


def taint_rules(suite: Suite, resource: str) -> list[JSON]:
    items: list[JSON] = suite.kube.get(
        path(RESOURCE, "devicetaintrules"), labelSelector=f"{names.PREFIX}/resource={resource}"
    )["items"]
    return items


def resource(suite: Suite, name: str) -> JSON | None:
    return suite.kube.get_or_none(path(API_VERSION, "composableresources", name))


def test_a_detached_gpu_is_never_both_listed_untainted_by_its_node_and_in_the_pool(
    make_suite: MakeSuite, namespace: str, unique: str
) -> None:
    suite = make_suite(plugin_poll=PLUGIN_POLL)
    state = suite.emulator.state()
    zones = set(state["systems"]["node-3"]["zones"])
    block = min(
        str(b) for b, s in state["blocks"].items() if s["zone"] in zones and s["state"] == "Unused"
    )
    uuid = normalize_uuid(str(state["blocks"][block]["uuid"]))
    name = f"idle-{unique}"
    # An idle GPU of node-3: a resource with no claim, so the node lists it as its own.
    suite.kube.create(
        path(API_VERSION, "composableresources"),
        {
            "apiVersion": API_VERSION,
            "kind": "ComposableResource",
            "metadata": {"name": name},
            "spec": {
                "fabric": suite.fabric,
                "deviceID": block,
                "targetNode": suite.node_of("node-3"),
            },
        },
    )
    # The slice lists it right after a poll of node-3's plugin: deleted now, the detach
    # ends seconds before the plugin reads the fabric again.
    [stale] = wait_for(
        lambda: local_refs(suite, "node-3", uuid),
        60,
        f"node-3 to list {block} as its own",
        interval=0.05,
        describe=suite.describe,
    )
    wait_for(
        lambda: (resource(suite, name) or {}).get("status", {}).get("phase") == "Online",
        30,
        f"{name} online",
        describe=suite.describe,
    )
    suite.kube.delete(path(API_VERSION, "composableresources", name))

    # Until the resource is gone: whenever node-3 lists the GPU and the pool offers the
    # block, the detach's taint is still there.
    def gone() -> bool:
        listed = bool(local_refs(suite, "node-3", uuid))
        tainted = bool(taint_rules(suite, name))
        pooled = block in {d for _, d in suite.pool_devices()}
        assert not (listed and pooled and not tainted), (
            f"{block} listed untainted by node-3 while in the pool: {suite.describe()}"
        )
        return resource(suite, name) is None

    wait_for(gone, 60, f"{name} to be deleted", interval=0.05, describe=suite.describe)
    # The resource is gone, so its block may be in the pool from now on: node-3 no longer
    # lists the GPU (and its taint is gone with the resource).
    assert local_refs(suite, "node-3", uuid) == set(), (
        f"node-3 still lists the detached {block}: {suite.describe()}"
    )
    assert taint_rules(suite, name) == []
    assert suite.composed() == {}

    # A claim (local first) for node-3 right then never gets the gone GPU.
    suite.create_pod(namespace, "p1", node=suite.node_of("node-3"))
    alloc = wait_for(
        lambda: (suite.claim(namespace, "p1").get("status") or {}).get("allocation"),
        30,
        "the claim's allocation",
        describe=suite.describe,
    )
    [r] = alloc["devices"]["results"]
    assert (r["pool"], r["device"]) != stale
    wait_for(lambda: suite.running(namespace, "p1"), 60, "p1 to run", describe=suite.describe)
