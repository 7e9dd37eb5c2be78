"""decide_detach's host-release gate: a device tainted and free of claims is detached only
once the node's host released it (the plugin's HostReleased), within a bound that a
NotReady node cannot hold forever; forceDetach skips it, and says so."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from composable_dra.fabric import backend as b
from composable_operator.reconcile import (
    DetachObservation,
    ReleaseObservation,
    decide_detach,
)

ATTACHED = b.Device(id="gpu-1", model="H100", zone="z1", uuid="u-1", state="attached", host="h1")


def ready_to_detach(release: ReleaseObservation | None, **kw: Any) -> DetachObservation:
    """Attached to the node's host, tainted, no claim references it."""
    base: dict[str, Any] = dict(
        device=ATTACHED, host="h1", tainted=True, referencing_claims=(), force=False
    )
    return DetachObservation(**{**base, **kw}, release=release)


def test_without_a_release_asked_it_detaches_as_before() -> None:
    a = decide_detach(ready_to_detach(None))
    assert (a.kind, a.reason) == ("detach", "Detaching")


def test_waits_for_the_host_release_and_says_why() -> None:
    a = decide_detach(ready_to_detach(ReleaseObservation(False, why="pid 42 uses it")))
    assert (a.kind, a.reason) == ("await_release", "AwaitingHostRelease")
    assert "pid 42 uses it" in a.message
    assert 0 < a.delay <= 2


def test_released_host_detaches() -> None:
    a = decide_detach(ready_to_detach(ReleaseObservation(True)))
    assert (a.kind, a.reason) == ("detach", "Detaching")


def test_past_the_bound_on_a_ready_node_it_keeps_waiting_and_says_so() -> None:
    a = decide_detach(ready_to_detach(ReleaseObservation(False, waited=121.0, limit=120.0)))
    assert (a.kind, a.reason) == ("await_release", "ReleaseOverdue")
    assert "forceDetach" in a.message


def test_a_notready_node_holds_the_detach_only_for_the_bound() -> None:
    early = ReleaseObservation(False, node_ready=False, waited=10.0, limit=120.0)
    assert decide_detach(ready_to_detach(early)).kind == "await_release"
    late = ReleaseObservation(False, node_ready=False, waited=120.0, limit=120.0)
    a = decide_detach(ready_to_detach(late))
    assert (a.kind, a.reason) == ("detach", "NodeNotReady")


def test_a_node_that_is_gone_is_detached_without_a_release() -> None:
    a = decide_detach(ready_to_detach(ReleaseObservation(False), node_exists=False))
    assert (a.kind, a.reason) == ("detach", "NodeGone")


def test_force_skips_the_release_and_is_audited() -> None:
    a = decide_detach(ready_to_detach(ReleaseObservation(False), force=True))
    assert (a.kind, a.reason) == ("detach", "ForcedDetach")
    assert "host release" in a.message


def test_force_past_a_claim_is_audited_too() -> None:
    a = decide_detach(
        ready_to_detach(ReleaseObservation(True), force=True, referencing_claims=("ns/c",))
    )
    assert (a.kind, a.reason) == ("detach", "ForcedDetach")
    assert "ns/c" in a.message


def test_untainted_devices_are_tainted_before_any_release_is_asked() -> None:
    a = decide_detach(ready_to_detach(ReleaseObservation(False), tainted=False))
    assert a.kind == "taint"


@given(
    released=st.booleans(),
    ready=st.booleans(),
    waited=st.floats(0, 1000),
    force=st.booleans(),
    node=st.booleans(),
)
def test_never_detaches_a_held_device_from_a_ready_node_unless_forced(
    released: bool, ready: bool, waited: float, force: bool, node: bool
) -> None:
    r = ReleaseObservation(released, node_ready=ready, waited=waited, limit=120.0)
    a = decide_detach(ready_to_detach(r, force=force, node_exists=node))
    if a.kind == "detach":
        assert released or force or not node or (not ready and waited >= 120.0)
