"""decide_detach after the fabric let the device go, while the node's plugin may still list
it: the taint stays until the node's slice drops the device, within a bound."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.fabric import backend as b
from composable_operator.reconcile import (
    DetachObservation,
    InFlight,
    decide_detach,
)

FREE = b.Device(id="gpu-1", model="H100", zone="z1", uuid="u-1", state="free", host=None)
ATTACHED = b.Device(id="gpu-1", model="H100", zone="z1", uuid="u-1", state="attached", host="h1")


def detached(**kw: Any) -> DetachObservation:
    """The fabric shows the block free; the detach tainted it earlier."""
    base: dict[str, Any] = dict(
        device=FREE,
        host="h1",
        tainted=True,
        referencing_claims=(),
        force=False,
        published_locally=True,
        unpublish_limit=60.0,
    )
    return DetachObservation(**{**base, **kw})


def test_still_listed_by_the_node_waits_with_the_taint() -> None:
    a = decide_detach(detached(unpublish_waited=5.0))
    assert a.kind == "await_unpublish"
    assert 0 < a.delay <= 2


def test_dropped_by_the_node_is_done() -> None:
    assert decide_detach(detached(published_locally=False)).kind == "done"


def test_listed_past_the_bound_is_untainted_loudly() -> None:
    a = decide_detach(detached(unpublish_waited=60.0))
    assert (a.kind, a.reason) == ("untaint_stale", "StillListed")


def test_a_node_that_is_gone_does_not_hold_the_finalizer() -> None:
    a = decide_detach(detached(node_exists=False, host=None))
    assert (a.kind, a.reason) == ("untaint_stale", "NodeGone")


def test_listed_but_never_tainted_is_tainted_first() -> None:
    # Detached behind our back: the stale local device gets the taint while it is listed.
    assert decide_detach(detached(tainted=False)).kind == "taint"


def test_an_attach_in_flight_still_goes_first() -> None:
    a = decide_detach(detached(attach=InFlight(call_running=True)))
    assert a.kind == "await_attach"


@pytest.mark.parametrize("published", [False, True])
def test_attached_to_the_node_is_detached_whatever_the_slice(published: bool) -> None:
    a = decide_detach(detached(device=ATTACHED, published_locally=published))
    assert a.kind == "detach"


@settings(max_examples=200)
@given(
    state=st.sampled_from(["free", "attached", "busy"]),
    host=st.sampled_from(["h1", "h2", None]),
    tainted=st.booleans(),
    claims=st.sampled_from([(), ("ns/c",)]),
    force=st.booleans(),
    published=st.booleans(),
    node_exists=st.booleans(),
    waited=st.floats(0, 120),
)
def test_never_done_while_the_node_lists_it(
    state: b.DeviceState,
    host: str | None,
    tainted: bool,
    claims: tuple[str, ...],
    force: bool,
    published: bool,
    node_exists: bool,
    waited: float,
) -> None:
    device = b.Device(
        id="gpu-1",
        model="H100",
        zone="z1",
        uuid="u-1",
        state=state,
        host=host if state == "attached" else None,
    )
    a = decide_detach(
        detached(
            device=device,
            tainted=tainted,
            referencing_claims=claims,
            force=force,
            published_locally=published,
            node_exists=node_exists,
            unpublish_waited=waited,
        )
    )
    # The untainting kinds: "done" only once the node's slice dropped the device, and
    # the loud one only for a node gone or past the bound.
    if published:
        assert a.kind != "done"
    if a.kind == "untaint_stale":
        assert published and (not node_exists or waited >= 60.0)
