"""A GPU leaving the node never joins its local slice (dra_driver/publish_once.py).

The race behind it: a pool attach cancelled mid-flight (its claim deleted) lands, the
plugin's device source lists the GPU, the operator detaches it and the resource goes. The
plugin then decided with the list read before the detach and no resource left to hide the
GPU: it published a detached GPU as a free local device, and a pod allocated it never ran.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dra_driver.device_source import DeviceInfo
from dra_driver.publish_once import LocalSliceGate, held_back, node_resources, publishable
from dra_driver.publish_once import reservations as reserve
from tests.unit.dra_driver.test_plugin_visibility import FreshKube, gpu, uuids
from tests.unit.dra_driver.test_plugin_visibility import resource as plugin_resource


def resource(
    uuid: str | None, phase: str = "Online", claim: bool = True, deleting: bool = False
) -> dict[str, Any]:
    r = plugin_resource(f"r-{uuid}", uuid, phase, claim=claim)
    if deleting:
        r["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return r


def test_a_gpu_whose_resource_is_being_deleted_or_detached_never_joins() -> None:
    resources = [
        resource("aaa", deleting=True),  # a pool GPU being detached
        resource("bbb", "Online", claim=False, deleting=True),  # an idle local one
        resource("ccc", "Detaching", claim=False),
        resource("ddd", "Detached"),
    ]
    res = reserve(resources)
    assert res.leaving == {"aaa", "bbb", "ccc", "ddd"}
    devices = [gpu("aaa"), gpu("bbb"), gpu("ccc"), gpu("ddd")]
    assert publishable(devices, res, published=set()) == []
    # One the slice already shows stays, under the detach's taint, until the source drops
    # it: the operator finds its allocations through the slice.
    assert uuids(publishable(devices, res, published={"bbb"})) == ["bbb"]


def test_a_resource_deleted_before_its_gpu_is_known_hides_unknown_gpus() -> None:
    # Deleted mid-attach, with or without a claim: its attach may still land.
    for claim in (True, False):
        res = reserve([resource(None, "Attaching", claim=claim, deleting=True)])
        assert res.pending
        assert publishable([gpu("new")], res, published=set()) == []


def test_a_gpu_stays_held_back_while_the_source_lists_it_after_its_resource_went() -> None:
    held = held_back(frozenset(), reserve([resource("aaa", deleting=True)]), {"aaa", "bbb"})
    assert held == {"aaa"}
    gone = reserve([])  # the resource is gone; the source's list is from before the detach
    held = held_back(held, gone, {"aaa", "bbb"})
    assert held == {"aaa"}
    assert uuids(publishable([gpu("aaa"), gpu("bbb")], gone, set(), held)) == ["bbb"]
    # A serving GPU whose resource goes is held back just the same.
    assert held_back(frozenset(), reserve([resource("ccc")]), {"ccc"}) == {"ccc"}
    assert held_back({"ccc"}, gone, {"ccc"}) == {"ccc"}
    # The source no longer lists it: nothing to hold.
    assert held_back(held, gone, {"bbb"}) == frozenset()
    # Named again by a live resource (released, or attached anew): the resource decides.
    released = reserve([resource("aaa", "Online", claim=False)])
    assert held_back(held, released, {"aaa"}) == frozenset()
    assert uuids(publishable([gpu("aaa")], released, set(), frozenset())) == ["aaa"]


@st.composite
def node_resources_st(draw: st.DrawFn) -> list[dict[str, Any]]:
    phases = st.sampled_from(["Attaching", "Online", "Detaching", "Detached", "Failed", None])
    return [
        resource(
            draw(st.sampled_from(["aaa", "bbb", "ccc", None])),
            draw(phases),  # type: ignore[arg-type]
            draw(st.booleans()),
            draw(st.booleans()),
        )
        for _ in range(draw(st.integers(0, 4)))
    ]


@given(
    node_resources_st(),
    st.sets(st.sampled_from(["aaa", "bbb", "ccc", "ddd"])),
    st.sets(st.sampled_from(["aaa", "bbb", "ccc", "ddd"])),
)
def test_no_leaving_or_held_gpu_ever_joins(
    resources: list[dict[str, Any]], listed: set[str], published: set[str]
) -> None:
    res = reserve(resources)
    held = held_back(frozenset(), res, listed)
    out = {d.uuid for d in publishable([gpu(u) for u in sorted(listed)], res, published, held)}
    assert not (out - published) & (res.leaving | held | res.serving)
    assert not out & res.serving


def test_a_cancelled_attach_gpu_is_not_published_from_a_list_read_before_its_detach() -> None:
    # The race, step by step. The source's last list shows the cancelled attach's
    # GPU (never named: its resource was deleted before the operator wrote a UUID); the
    # resource goes after the detach; a fresh read of the fabric no longer shows the GPU.
    kube = FreshKube([])
    cached = [gpu("local")]
    fabric: list[DeviceInfo] | None = [gpu("local")]
    published: list[list[DeviceInfo]] = []
    informer = node_resources(kube, "n1", lambda: None)  # type: ignore[arg-type]
    gate = LocalSliceGate(
        kube,  # type: ignore[arg-type]
        "n1",
        informer,
        devices=lambda: cached,
        publish=published.append,
        read_devices=lambda: fabric,
    )
    informer.replace([])
    gate.republish()
    assert [uuids(p) for p in published] == [["local"]]
    cancelled = resource(None, "Attaching", deleting=True)
    informer.replace([cancelled])
    kube.items = [cancelled]
    cached.append(gpu("cancelled"))  # the attach landed; the source listed it
    gate.republish()
    assert len(published) == 1
    informer.replace([])  # detached; the resource is gone
    kube.items = []
    fabric = [gpu("local")]
    gate.republish()
    assert [uuids(p) for p in published] == [["local"]]
    # The source unreadable: nothing joins.
    fabric = None
    cached.append(gpu("new"))
    gate.republish()
    assert [uuids(p) for p in published] == [["local"]]
    fabric = [gpu("local"), gpu("new")]
    gate.republish()
    assert [uuids(p) for p in published] == [["local"], ["local", "new"]]
