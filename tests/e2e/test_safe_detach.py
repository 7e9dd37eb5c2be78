"""No GPU leaves a host while the host still holds it, end to end: the real control plane,
the Redfish emulator, the operator (``--await-host-release``), pool publisher, scaler and
plugins each a process of their own (testbed/harness.py), on kubelet emulators.

node-1's and node-2's plugins read their GPUs through the fake NVML (testbed/fake_nvml)
over the host state the emulator shares (fabric_emulator/host_bus.py): the emulator
writes a GPU there when it attaches the block, the test writes the processes using it,
and node-1's release command (the fake's "PCI remove") marks it released. node-2's plugin
has no release command: a plugin that skips its release step. "Held" is read by the
emulator from that state at the removal, never from anything the plugin writes, so the
emulator's surprise-removal record catches a skipped release.
"""

from __future__ import annotations

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.conditions import find
from composable_dra.k8s.kube import JSON, path
from composable_dra.model import names
from fabric_emulator import host_bus
from testbed.harness import Suite
from testbed.objects import create_resource
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = pytest.mark.e2e
HELD_PID = 4242


def resource(suite: Suite, name: str) -> JSON | None:
    return suite.kube.get_or_none(path(API_VERSION, "composableresources", name))


def condition(suite: Suite, name: str, kind: str) -> JSON:
    return find(((resource(suite, name) or {}).get("status") or {}).get("conditions"), kind) or {}


def free_block(suite: Suite, host: str) -> tuple[str, str]:
    """A free block the host can take, and its GPU's UUID."""
    state = suite.emulator.state()
    zones = set(state["systems"][host]["zones"])
    block = min(
        str(b) for b, s in state["blocks"].items() if s["zone"] in zones and s["state"] == "Unused"
    )
    return block, str(state["blocks"][block]["uuid"])


def online(suite: Suite, name: str, host: str, block: str) -> None:
    """An idle GPU of ``host`` (a resource with no claim), attached and Online."""
    create_resource(suite.kube, name, suite.fabric, block, suite.node_of(host))
    wait_for(
        lambda: ((resource(suite, name) or {}).get("status") or {}).get("phase") == "Online",
        60,
        f"{name} online",
        describe=suite.describe,
    )


def events(suite: Suite, name: str) -> dict[str, str]:
    """The resource's Events, reason -> message."""
    items = suite.kube.get(
        path("v1", "events", namespace="default"),
        fieldSelector=f"involvedObject.name={name}",
    )["items"]
    return {str(e["reason"]): str(e.get("message", "")) for e in items}


def held_then_deleted(suite: Suite, name: str) -> tuple[str, str]:
    """A GPU of node-1, Online, a process on it (the fake NVML's table), its resource
    deleted: once the plugin says the process holds it. Its block and UUID."""
    root = suite.emulator.host_state_dir
    assert root is not None
    block, uuid = free_block(suite, "node-1")
    online(suite, name, "node-1", block)
    host_bus.set_processes(root, "node-1", uuid, (HELD_PID,))
    suite.kube.delete(path(API_VERSION, "composableresources", name))
    wait_for(
        lambda: condition(suite, name, names.HOST_RELEASED).get("reason") == "InUse",
        30,
        "the plugin to say a process holds the GPU",
        describe=suite.describe,
    )
    return block, uuid


@pytest.fixture
def suite(make_suite: MakeSuite) -> Suite:
    return make_suite(
        hosts=("node-1", "node-2"),
        fake_nvml_hosts=("node-1", "node-2"),
        skip_release_hosts=("node-2",),
        operator_args=["--await-host-release", "--host-release-timeout=5"],
    )


# Long because it is one scenario read top to bottom; its steps share what it built.
def test_a_detach_waits_for_the_gpus_process_then_releases_and_detaches(
    suite: Suite, unique: str
) -> None:
    root = suite.emulator.host_state_dir
    assert root is not None
    name = f"held-{unique}"
    block, uuid = held_then_deleted(suite, name)
    assert str(HELD_PID) in condition(suite, name, names.HOST_RELEASED)["message"]
    assert condition(suite, name, names.RELEASE_REQUESTED).get("status") == "True"
    # Past the 5 s bound the operator says why it waits, and still waits.
    wait_for(
        lambda: condition(suite, name, names.RELEASE_REQUESTED).get("reason") == "ReleaseOverdue",
        30,
        "the operator to say the release is overdue",
        describe=suite.describe,
    )
    # The Event follows the condition's write: waited for, not assumed.
    wait_for(lambda: "ReleaseOverdue" in events(suite, name), 10, "the ReleaseOverdue Event")
    assert suite.emulator.state()["blocks"][block]["system"] == "node-1"
    assert host_bus.gpus(root, "node-1")[0].released is False

    host_bus.set_processes(root, "node-1", uuid, ())  # the process exits
    wait_for(
        lambda: resource(suite, name) is None,
        60,
        f"{name} detached and gone",
        describe=suite.describe,
    )
    assert suite.emulator.state()["blocks"][block]["state"] == "Unused"
    assert host_bus.gpus(root, "node-1") == []
    assert suite.emulator.surprise_removals() == []


def test_a_plugin_that_skips_its_release_step_is_caught(suite: Suite, unique: str) -> None:
    block, _ = free_block(suite, "node-2")
    name = f"skips-{unique}"
    online(suite, name, "node-2", block)
    suite.kube.delete(path(API_VERSION, "composableresources", name))
    wait_for(lambda: resource(suite, name) is None, 60, f"{name} gone", describe=suite.describe)
    # node-2's plugin said HostReleased (no process), but its host never let go.
    [surprise] = suite.emulator.surprise_removals()
    assert (surprise["block"], surprise["system"]) == (block, "node-2")
    assert "not released" in surprise["why"]
    suite.accepted_surprises.add(block)  # this test's own, on purpose


def test_force_detach_skips_the_release_and_is_audited(suite: Suite, unique: str) -> None:
    name = f"forced-{unique}"
    block, _ = held_then_deleted(suite, name)
    suite.kube.merge_patch(
        path(API_VERSION, "composableresources", name), {"spec": {"forceDetach": True}}
    )
    wait_for(lambda: resource(suite, name) is None, 60, f"{name} gone", describe=suite.describe)
    assert "forceDetach" in events(suite, name).get("ForcedDetach", "")
    # The emulator saw what the force did: the process still held the GPU.
    [surprise] = suite.emulator.surprise_removals()
    assert surprise["block"] == block and str(HELD_PID) in surprise["why"]
    suite.accepted_surprises.add(block)
