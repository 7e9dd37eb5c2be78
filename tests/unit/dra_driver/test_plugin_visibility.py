"""The plugin's view of fabric attachments: DeviceVisible and publishing each GPU once."""

from __future__ import annotations

import threading
from typing import Any

from composable_dra.model import names
from dra_driver.device_source import DeviceInfo
from dra_driver.device_visibility import VisibilityReporter, awaiting, visibility_updates
from dra_driver.publish_once import LocalSliceGate, node_resources, publishable, reservations


def resource(
    name: str,
    uuid: str | None,
    phase: str = "Attaching",
    claim: bool = False,
    visible: str | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if uuid:
        status["deviceUUID"] = uuid
    if visible:
        status["conditions"] = [{"type": names.DEVICE_VISIBLE, "status": visible}]
    spec: dict[str, Any] = {"targetNode": "n1"}
    if claim:
        spec["claimRef"] = {"namespace": "a", "name": "c", "uid": "u"}
    return {"metadata": {"name": name}, "spec": spec, "status": status}


def gpu(uuid: str) -> DeviceInfo:
    return DeviceInfo(name=f"gpu-{uuid.lower()}", uuid=uuid)


def uuids(devices: list[DeviceInfo] | None) -> list[str]:
    return [d.uuid for d in devices or []]


def test_devices_serving_a_claim_are_not_published_locally() -> None:
    resources = [
        resource("a", "GPU-AAA", "Online", claim=True),
        resource("b", "bbb", "Online"),  # idle: published as local
        resource("c", "ccc", "Detached", claim=True),  # leaving the node: never joins
        resource("d", "ddd", "Failed", claim=True),  # may be attached all the same
    ]
    res = reservations(resources)
    assert res.serving == {"aaa", "ddd"}
    assert res.released == {"bbb"}
    assert res.leaving == {"ccc"}
    assert not res.pending
    kept = publishable([gpu("aaa"), gpu("bbb"), gpu("ccc"), gpu("ddd")], res, ())
    assert uuids(kept) == ["bbb"]


def test_a_gpu_attached_for_a_claim_before_its_uuid_is_known_is_not_published() -> None:
    # The fabric shows the GPU on the node before the operator writes its UUID: the
    # resource has a claimRef and no UUID yet. A device the slice does not show yet stays
    # out (it may be that GPU); one already shown, and released GPUs, stay in.
    resources = [
        resource("attaching", None, "Attaching", claim=True),
        resource("idle", "bbb", "Online"),
    ]
    res = reservations(resources)
    assert res.pending
    devices = [gpu("aaa"), gpu("bbb"), gpu("new")]
    assert uuids(publishable(devices, res, {"aaa"})) == ["aaa", "bbb"]
    # A resource without a claimRef (a ComposabilityRequest's) serves no pool allocation.
    assert not reservations([resource("req", None, "Attaching")]).pending


def test_visibility_is_written_only_when_it_changes() -> None:
    present = {"aaa"}
    resources = [
        resource("seen", "GPU-aaa"),
        resource("unseen", "bbb"),
        resource("already", "aaa", visible="True"),
        resource("none", None),
    ]
    assert visibility_updates(resources, present) == {"seen": True, "unseen": False}


def test_a_device_that_went_away_is_reported_not_visible() -> None:
    resources = [resource("gone", "aaa", "Online", visible="True")]
    assert visibility_updates(resources, set()) == {"gone": False}


def test_awaiting_lists_attached_devices_the_node_does_not_show() -> None:
    resources = [resource("a", "aaa"), resource("b", "bbb"), resource("c", "ccc", "Online")]
    assert awaiting(resources, {"aaa"}) == ["b"]


class FreshKube:
    """The API server's answer to the watcher's consistent list of the node's resources."""

    def __init__(self, items: list[dict[str, Any]] | None) -> None:
        self.items, self.reads = items, 0

    def get(self, url: str, **_: Any) -> dict[str, Any]:
        self.reads += 1
        if self.items is None:
            raise ConnectionError("API server unreachable")
        return {"items": self.items}


class Plugin:
    """The gate and the reporter as the plugin wires them, over one (not started) watch."""

    def __init__(self, kube: FreshKube, devices: list[DeviceInfo]) -> None:
        self.published: list[list[DeviceInfo]] = []
        self.resources = node_resources(kube, "n1", lambda: None)  # type: ignore[arg-type]
        self.gate = LocalSliceGate(
            kube,  # type: ignore[arg-type]  # only the consistent list
            "n1",
            self.resources,
            devices=lambda: devices,
            publish=self.published.append,
        )
        self.reporter = VisibilityReporter(
            kube,  # type: ignore[arg-type]
            "n1",
            self.resources,
            threading.Event(),
            devices=lambda: devices,
            refresh=lambda: None,
            republish=self.gate.republish,
        )

    def seen(self, *resources: dict[str, Any]) -> None:
        """The watch has listed these resources (and so knows the node's resources)."""
        self.resources.replace(list(resources))


def make_watcher(
    kube: FreshKube, devices: list[DeviceInfo]
) -> tuple[Plugin, list[list[DeviceInfo]]]:
    plugin = Plugin(kube, devices)
    return plugin, plugin.published


def test_nothing_is_published_before_the_nodes_resources_are_known() -> None:
    devices = [gpu("aaa"), gpu("bbb")]
    serving = resource("a", "aaa", "Online", claim=True, visible="True")
    watcher, published = make_watcher(FreshKube([serving]), devices)
    # A restarted plugin must not offer a GPU that serves a pool allocation as local.
    watcher.gate.republish()
    watcher.reporter.sync()
    assert published == []
    watcher.seen(serving)
    watcher.reporter.sync()
    assert [uuids(p) for p in published] == [["bbb"]]
    watcher.gate.republish()  # nothing changed: nothing handed over again
    assert len(published) == 1


def test_a_new_device_is_published_only_when_a_consistent_read_agrees() -> None:
    # The watch cache has not seen the resource created for a pool claim; the fabric has
    # already attached its GPU. The consistent read has the resource: the GPU stays out.
    devices = [gpu("aaa")]
    kube = FreshKube([resource("x", None, "Attaching", claim=True)])
    watcher, published = make_watcher(kube, devices)
    watcher.seen()
    watcher.gate.republish()
    assert kube.reads == 1
    assert [uuids(p) for p in published] == [[]]
    # The operator writes the UUID: still the pool allocation's.
    kube.items = [resource("x", "aaa", "Attaching", claim=True)]
    watcher.gate.republish()
    assert [uuids(p) for p in published] == [[]]
    # Released: now a local device, once the watch shows the release too (a GPU kept
    # out as the pool allocation's stays out while no resource the gate knows names it).
    kube.items = [resource("x", "aaa", "Online")]
    watcher.gate.republish()
    assert [uuids(p) for p in published] == [[]]
    watcher.seen(*kube.items)
    watcher.gate.republish()
    assert [uuids(p) for p in published] == [[], ["aaa"]]
    reads = kube.reads
    watcher.gate.republish()  # nothing new to add: no read
    assert kube.reads == reads


def test_an_unreadable_api_server_never_grows_the_local_slice() -> None:
    devices = [gpu("aaa")]
    kube = FreshKube(None)
    watcher, published = make_watcher(kube, devices)
    watcher.seen()
    watcher.gate.republish()
    assert published == []  # nothing known: nothing published, not even an empty slice
    kube.items = []
    watcher.gate.republish()
    assert [uuids(p) for p in published] == [["aaa"]]
    devices.append(gpu("bbb"))
    kube.items = None
    watcher.gate.republish()
    assert [uuids(p) for p in published] == [["aaa"]]  # bbb waits for a read


def test_a_released_fabric_gpu_is_published_but_never_lent() -> None:
    from dra_driver.slices import LendPolicy, lend_layout

    devices = [gpu("aaa"), gpu("bbb")]
    kube = FreshKube([resource("x", "aaa", "Online")])  # released: an idle local device
    watcher, published = make_watcher(kube, devices)
    watcher.seen(resource("x", "aaa", "Online"))
    watcher.gate.republish()
    assert [uuids(p) for p in published] == [["aaa", "bbb"]]
    assert watcher.gate.fabric_uuids == frozenset({"aaa"})
    policy = LendPolicy(network_domain="d", link_gbps=10, max_leases=1)
    layout = lend_layout("n1", published[-1], policy, keep=watcher.gate.fabric_uuids)
    lent = {
        d["attributes"]["uuid"]["string"]
        for s in layout
        for d in s.get("devices") or []
        if d["attributes"]["attachment"] == {"string": "remote"}
    }
    assert lent == {"bbb"}
    # A resource that comes to name an already published GPU (an adopted orphan): the
    # same devices are handed over again, with the new set never to lend.
    watcher.seen(resource("x", "aaa", "Online"), resource("y", "bbb", "Online"))
    watcher.gate.republish()
    assert len(published) == 2 and watcher.gate.fabric_uuids == frozenset({"aaa", "bbb"})


def test_only_local_gpus_are_lent() -> None:
    from dra_driver.slices import LendPolicy, lend_layout

    fabric = DeviceInfo(name="gpu-f", uuid="GPU-F", attachment="fabric")
    local = DeviceInfo(name="gpu-l", uuid="GPU-L")
    layout = lend_layout("n1", [fabric, local], LendPolicy("d", 10, 1))
    names = {d["name"] for s in layout for d in s.get("devices") or []}
    assert names == {"gpu-f", "gpu-l", "gpu-l-remote"}
    # A GPU not lent stays in a plain slice of the node, where a reader of spec.nodeName
    # (the operator's detach check) finds it, and takes no counter.
    (plain,) = [s for s in layout if s.get("nodeName") and s.get("devices")]
    assert [d["name"] for d in plain["devices"]] == ["gpu-f"]
    assert "consumesCounters" not in plain["devices"][0]
    counter_sets = {c["name"] for s in layout for c in s.get("sharedCounters") or []}
    assert counter_sets == {"link", "gpu-l"}


def test_devices_attached_together_are_reported_together() -> None:
    # Three GPUs show on the node in one pass: their DeviceVisible writes are in flight at
    # once (each write waits here until all three are), not one after another.
    class TogetherKube(FreshKube):
        def __init__(self) -> None:
            super().__init__([])
            self.arrived = threading.Barrier(3, timeout=10)
            self.written: list[str] = []

        def apply(self, url: str, body: dict[str, Any], manager: str) -> dict[str, Any]:
            self.arrived.wait()
            self.written.append(body["metadata"]["name"])
            return body

    kube = TogetherKube()
    devices = [gpu("aaa"), gpu("bbb"), gpu("ccc")]
    watcher, _ = make_watcher(kube, devices)
    watcher.seen(*(resource(n, n, "Attaching", claim=True) for n in ("aaa", "bbb", "ccc")))
    watcher.reporter.sync()
    assert sorted(kube.written) == ["aaa", "bbb", "ccc"]
