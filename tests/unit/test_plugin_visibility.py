"""The plugin's view of fabric attachments: DeviceVisible and publishing each GPU once."""

from __future__ import annotations

from typing import Any

from composable_dra import names
from dra_driver.device_source import DeviceInfo
from dra_driver.visibility import awaiting, local_devices, serving_uuids, visibility_updates


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


def test_devices_serving_a_claim_are_not_published_locally() -> None:
    resources = [
        resource("a", "GPU-AAA", "Online", claim=True),
        resource("b", "bbb", "Online"),  # idle: published as local
        resource("c", "ccc", "Detached", claim=True),
    ]
    serving = serving_uuids(resources)
    assert serving == {"aaa"}
    kept = local_devices([gpu("aaa"), gpu("bbb"), gpu("ccc")], serving)
    assert [d.uuid for d in kept] == ["bbb", "ccc"]


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


def test_nothing_is_published_before_the_nodes_resources_are_known() -> None:
    from dra_driver.visibility import AttachmentWatcher

    published: list[list[DeviceInfo]] = []
    devices = [gpu("aaa"), gpu("bbb")]
    watcher = AttachmentWatcher(
        kube=None,  # type: ignore[arg-type]  # not started: no API calls
        node="n1",
        devices=lambda: devices,
        refresh=lambda: None,
        publish=published.append,
    )
    # A restarted plugin must not offer a GPU that serves a pool allocation as local.
    assert watcher.local_devices(devices) is None
    watcher.sync()
    assert published == []
    watcher._resources = {"a": resource("a", "aaa", "Online", claim=True, visible="True")}
    watcher.synced.set()
    watcher.sync()
    assert [[d.uuid for d in p] for p in published] == [["bbb"]]
    assert [d.uuid for d in watcher.local_devices(devices) or []] == ["bbb"]
