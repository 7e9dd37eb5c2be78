"""Two DeviceClasses that map one extended resource name: which one the scheduler uses,
and the warning the publisher gives once per clash."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from composable_dra.model import names
from pool_publisher.class_clash import (
    EVENT_NAMESPACE,
    REASON,
    Clash,
    ClashReporter,
    clash_event,
    clashes,
    selects_driver,
    to_refresh,
)

JSON = dict[str, Any]
NVIDIA = "gpu.nvidia.com"


def device_class(name: str, driver: str, created: str, resource: str | None = None) -> JSON:
    spec: JSON = {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}
    if resource is not None:
        spec["extendedResourceName"] = resource
    return {
        "metadata": {"name": name, "creationTimestamp": created, "uid": f"u-{name}"},
        "spec": spec,
    }


OURS = device_class(
    "composable-gpu-extended", names.DRIVER, "2026-01-02T00:00:00Z", "nvidia.com/gpu"
)
THEIRS = device_class("gpu.nvidia.com", NVIDIA, "2026-01-01T00:00:00Z", "nvidia.com/gpu")


def gauge(clash: Clash) -> float | None:
    return REGISTRY.get_sample_value(
        "composable_dra_pool_publisher_extended_resource_clashes",
        {"resource": clash.resource, "winner": clash.winner, "loser": clash.loser},
    )


def test_the_class_created_later_wins() -> None:
    assert clashes([THEIRS, OURS], names.DRIVER) == [
        Clash("nvidia.com/gpu", "composable-gpu-extended", "gpu.nvidia.com")
    ]
    newer_theirs = device_class("gpu.nvidia.com", NVIDIA, "2026-01-03T00:00:00Z", "nvidia.com/gpu")
    assert clashes([OURS, newer_theirs], names.DRIVER) == [
        Clash("nvidia.com/gpu", "gpu.nvidia.com", "composable-gpu-extended")
    ]


def test_created_together_the_name_sorted_first_wins() -> None:
    same = "2026-01-02T00:00:00Z"
    theirs = device_class("a-nvidia", NVIDIA, same, "nvidia.com/gpu")
    assert clashes([OURS, theirs], names.DRIVER) == [
        Clash("nvidia.com/gpu", "a-nvidia", "composable-gpu-extended")
    ]


def test_no_clash_without_two_classes_or_without_ours() -> None:
    assert clashes([OURS], names.DRIVER) == []
    other = device_class("example", "example.com", "2026-01-01T00:00:00Z", "example.com/gpu")
    assert clashes([OURS, other], names.DRIVER) == []  # different names
    two_theirs = [THEIRS, device_class("b", NVIDIA, "2026-01-05T00:00:00Z", "nvidia.com/gpu")]
    assert clashes(two_theirs, names.DRIVER) == []  # not ours to warn about
    unmapped = device_class("composable-gpu", names.DRIVER, "2026-01-09T00:00:00Z")
    assert clashes([THEIRS, unmapped], names.DRIVER) == []
    going = {**OURS, "metadata": {**OURS["metadata"], "deletionTimestamp": "2026-01-09T00:00:00Z"}}
    assert clashes([THEIRS, going], names.DRIVER) == []


def test_selects_driver_reads_the_cel_selectors() -> None:
    assert selects_driver(OURS, names.DRIVER)
    assert not selects_driver(THEIRS, names.DRIVER)
    single = {
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{names.DRIVER}'"}}]}
    }
    assert selects_driver(single, names.DRIVER)
    assert not selects_driver({"spec": {}}, names.DRIVER)


def test_reporter_tells_each_clash_once_and_clears_it_when_it_ends() -> None:
    posted: list[Clash] = []
    reporter = ClashReporter(names.DRIVER, posted.append)
    [clash] = reporter.check([THEIRS, OURS])
    assert posted == [clash]
    assert gauge(clash) == 1
    reporter.check([THEIRS, OURS])
    assert posted == [clash]  # once, not on every pass
    assert reporter.check([OURS]) == []
    assert gauge(clash) is None


def test_the_event_names_both_classes_on_the_ignored_one() -> None:
    clash = Clash("nvidia.com/gpu", "composable-gpu-extended", "gpu.nvidia.com")
    event = clash_event(clash, "u-1")
    assert event["type"] == "Warning"
    assert event["reason"] == REASON
    assert event["metadata"]["namespace"] == EVENT_NAMESPACE
    assert event["involvedObject"] == {
        "kind": "DeviceClass",
        "apiVersion": "resource.k8s.io/v1",
        "name": "gpu.nvidia.com",
        "uid": "u-1",
    }
    assert "composable-gpu-extended" in event["message"]
    assert "gpu.nvidia.com" in event["message"]


def test_our_class_left_alone_after_a_clash_is_touched_once() -> None:
    """kube-scheduler v1.37.1 drops the name from its cache when either class goes: ours,
    left alone, is touched so that the scheduler maps the name again."""
    touched: list[str] = []
    reporter = ClashReporter(names.DRIVER, lambda _: None, touched.append)
    reporter.check([THEIRS, OURS])
    reporter.check([OURS])  # theirs deleted
    assert touched == ["composable-gpu-extended"]
    reporter.check([OURS])
    assert touched == ["composable-gpu-extended"]  # once, when the clash ended


def test_only_our_class_is_touched() -> None:
    ended = [Clash("nvidia.com/gpu", "composable-gpu-extended", "gpu.nvidia.com")]
    assert to_refresh(ended, [OURS], names.DRIVER) == ["composable-gpu-extended"]
    assert to_refresh(ended, [THEIRS], names.DRIVER) == []  # ours went: theirs is not ours
    assert to_refresh(ended, [], names.DRIVER) == []
    third = device_class("c", NVIDIA, "2026-01-09T00:00:00Z", "nvidia.com/gpu")
    assert to_refresh(ended, [OURS, third], names.DRIVER) == []  # still a clash
