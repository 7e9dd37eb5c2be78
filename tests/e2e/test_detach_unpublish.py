"""A detached GPU leaves its node's slice before its block is back in the pool, end to
end: the real control plane, the Redfish emulator, the operator, pool publisher, scaler
and plugins each a process of their own (testbed/harness.py); node-3, the node
of the GPU, is a real node (the upstream kubelet, containerd, runc).

The plugins poll the fabric every 6 s here, so a detached GPU stays in its node's slice
for seconds after the fabric let it go. The detach must keep its taint until the slice
drops the device: the resource's end puts the block back in the pool, and the stale
local device, untainted, could then be allocated (a GPU that is gone, or one GPU twice).
"""

from __future__ import annotations

import contextlib
import datetime
import json
from pathlib import Path

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import JSON, path
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from testbed.harness import Suite
from testbed.objects import RESOURCE, create_resource
from testbed.realnodes import describe_nodes, plugin_of, suite_pod
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e
PLUGIN_POLL = 6.0


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


def polls(suite: Suite) -> int:
    return next(int(r.get("fired", 0)) for r in suite.emulator.faults() if r["id"] == "polls")


def log_events(log: Path, event: str) -> list[tuple[datetime.datetime, JSON]]:
    """(time, record) of a component's JSON log records of one event."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == event:
                when = datetime.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
                out.append((when, record))
    return out


def resource(suite: Suite, name: str) -> JSON | None:
    return suite.kube.get_or_none(path(API_VERSION, "composableresources", name))


# Long because it is one scenario read top to bottom; its steps share what it built.
def test_a_detached_gpu_is_never_both_listed_untainted_by_its_node_and_in_the_pool(
    make_suite: MakeSuite, namespace: str, unique: str
) -> None:
    suite = make_suite(plugin_poll=PLUGIN_POLL, real_hosts=("node-3",))
    state = suite.emulator.state()
    zones = set(state["systems"]["node-3"]["zones"])
    block = min(
        str(b) for b, s in state["blocks"].items() if s["zone"] in zones and s["state"] == "Unused"
    )
    uuid = normalize_uuid(str(state["blocks"][block]["uuid"]))
    name = f"idle-{unique}"
    # An idle GPU of node-3: a resource with no claim, so the node lists it as its own.
    create_resource(suite.kube, name, suite.fabric, block, suite.node_of("node-3"))
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
    # Delete right after one of node-3's plugin's polls: the detach ends seconds before the
    # plugin reads the fabric again. (A latency rule of 1 ms counts the polls; once the
    # device is visible, only the periodic poll reads node-3's processors.)
    suite.emulator.add_fault(
        {
            "id": "polls",
            "kind": "latency",
            "latency": 0.001,
            "method": "GET",
            "path": r"/Systems/node-3/Processors$",
        }
    )
    wait_for(lambda: polls(suite) >= 1, 30, "a poll of node-3's plugin", interval=0.02)
    seen = polls(suite)
    wait_for(lambda: polls(suite) > seen, 30, "the next poll of node-3's plugin", interval=0.02)
    deleted = datetime.datetime.now(datetime.UTC)
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
    # The same, in the components' own order (their logs, one clock, whatever this test's
    # process was doing meanwhile): the plugin dropped the GPU before the detach ended.
    dropped = wait_for(
        lambda: next(
            (
                t
                for t, e in log_events(plugin_of(suite, "node-3").log_path, "devices changed")
                if t > deleted and stale[1] not in e.get("devices", [])
            ),
            None,
        ),
        30,
        "node-3's plugin to drop the GPU",
        describe=suite.describe,
    )
    assert suite.operator is not None
    [detached] = [
        t for t, e in log_events(suite.operator.log_path, "detached") if e.get("resource") == name
    ]
    assert dropped < detached, f"detach ended at {detached}, the node dropped the GPU at {dropped}"
    assert suite.composed() == {}

    # A claim (local first) for node-3 right then never gets the gone GPU.
    suite_pod(suite, namespace, "p1", node=suite.node_of("node-3"))
    alloc = wait_for(
        lambda: (suite.claim(namespace, "p1").get("status") or {}).get("allocation"),
        30,
        "the claim's allocation",
        describe=suite.describe,
    )
    [r] = alloc["devices"]["results"]
    assert (r["pool"], r["device"]) != stale
    wait_for(
        lambda: suite.running(namespace, "p1"),
        60,
        "p1 to run",
        describe=lambda: describe_nodes(suite),
    )
