"""The probe adapter (composable_dra/k8s/feature_probe.py) over a fake API server: each probe
is a dry run, what a server refuses is an absent feature, what says nothing about the
feature is an error, and the start check logs one line, sets the metric and refuses."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from composable_dra.k8s import feature_probe as fp
from composable_dra.k8s.features import Feature
from composable_dra.k8s.kube import KubeError, NotFound

DRIVER = "gpu.composable.dra.io"
LENDING = fp.Probes(DRIVER, node="donor", slices=True, partitions=True)
Answer = Callable[[dict[str, Any]], Any]


def echo(body: dict[str, Any]) -> Any:
    return copy.deepcopy(body)


class FakeKube:
    """Discovery answers ``versions``; a POST to a plural answers by ``answers[plural]``
    (echo: every field kept), or raises what it is given."""

    def __init__(self, versions: list[str], **answers: Answer | KubeError) -> None:
        self.versions = versions
        self.answers = answers
        self.posts: list[tuple[str, dict[str, Any], dict[str, Any]]] = []

    def get(self, url: str) -> Any:
        assert url == "/apis/resource.k8s.io"
        if not self.versions:
            raise NotFound(404, "NotFound", "the server could not find the requested resource")
        return {"versions": [{"version": v} for v in self.versions]}

    def request(self, method: str, url: str, *, body: Any, query: dict[str, Any]) -> Any:
        assert method == "POST"
        self.posts.append((url, body, query))
        plural = url.rsplit("/", 1)[1]
        answer = self.answers.get(plural, echo)
        if isinstance(answer, KubeError):
            raise answer
        return answer(body)


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append(("info", event, kw))

    def error(self, event: str, **kw: Any) -> None:
        self.lines.append(("error", event, kw))


def drop_gated(body: dict[str, Any]) -> Any:
    """What v1.35 does with the plugin's slices: the gated fields go."""
    out = copy.deepcopy(body)
    for device in out["spec"]["devices"]:
        for key in ("bindingConditions", "bindingFailureConditions", "bindsToNode", "taints"):
            device.pop(key, None)
    if out["spec"].pop("perDeviceNodeSelection", None):
        raise KubeError(422, "Invalid", "spec: Required value: exactly one of nodeName ...")
    return out


def test_every_probe_is_a_dry_run_of_the_writers_own_objects() -> None:
    kube = FakeKube(["v1"])
    found = fp.detect(kube, fp.Probes(DRIVER, node="donor", slices=True, partitions=True))
    assert found.present == {
        Feature.RESOURCE_V1,
        Feature.BINDING_CONDITIONS,
        Feature.DEVICE_TAINTS,
        Feature.PARTITIONABLE_DEVICES,
    }
    assert [q for _, _, q in kube.posts] == [{"dryRun": "All"}] * 2
    assert {url for url, _, _ in kube.posts} == {"/apis/resource.k8s.io/v1/resourceslices"}
    assert all(b["spec"]["pool"]["name"] == "donor" for _, b, _ in kube.posts)


def test_the_gated_fields_dropped_and_an_invalid_slice_are_absent_features() -> None:
    kube = FakeKube(["v1", "v1beta2"], resourceslices=drop_gated)
    found = fp.detect(kube, LENDING)
    assert found.present == {Feature.RESOURCE_V1}
    assert "dropped the field" in found.why[Feature.DEVICE_TAINTS]
    assert "422" in found.why[Feature.PARTITIONABLE_DEVICES]


def test_a_taint_rule_resource_not_served_is_absent() -> None:
    missing = NotFound(404, "NotFound", "the server could not find the requested resource")
    kube = FakeKube(["v1"], devicetaintrules=missing)
    found = fp.detect(kube, fp.Probes(DRIVER, taint_rules=True))
    assert found.probed == {Feature.RESOURCE_V1, Feature.DEVICE_TAINT_RULES}
    assert found.missing(found.probed) == [Feature.DEVICE_TAINT_RULES]
    assert "404" in found.why[Feature.DEVICE_TAINT_RULES]


def test_without_resource_v1_nothing_is_posted() -> None:
    kube = FakeKube(["v1beta1"])
    found = fp.detect(kube, LENDING)
    assert found.present == frozenset() and not kube.posts
    assert "v1beta1" in found.why[Feature.RESOURCE_V1]
    assert "not served" in found.why[Feature.PARTITIONABLE_DEVICES]


@pytest.mark.parametrize("status", [401, 403, 500, 503])
def test_an_answer_that_says_nothing_about_the_feature_is_an_error(status: int) -> None:
    kube = FakeKube(["v1"], resourceslices=KubeError(status, "X", "no"))
    with pytest.raises(fp.FeatureProbeError, match=f"resourceslices: {status}"):
        fp.detect(kube, LENDING)


def test_the_start_check_logs_one_line_and_sets_the_metric() -> None:
    log = Log()
    fp.check_at_start(FakeKube(["v1"]), LENDING, ["lending (--lend)"], log, "plugin")
    assert log.lines == [
        (
            "info",
            "api features",
            {
                "component": "plugin",
                "resource_versions": "v1",
                "uses": "resource-v1,binding-conditions,partitionable-devices,device-taints",
                "missing": "",
            },
        )
    ]
    assert fp.API_FEATURE.labels(feature="partitionable-devices")._value.get() == 1


def test_the_start_check_refuses_lending_naming_the_gates() -> None:
    log = Log()
    kube = FakeKube(["v1"], resourceslices=drop_gated)
    with pytest.raises(SystemExit) as exc:
        fp.check_at_start(kube, LENDING, ["lending (--lend)"], log, "plugin")
    assert str(exc.value).startswith("plugin: lending (--lend) needs")
    assert "DRAPartitionableDevices" in str(exc.value)
    assert "DRADeviceBindingConditions" in str(exc.value)
    assert [e for _, e, _ in log.lines] == ["api features", "refused"]
    assert fp.API_FEATURE.labels(feature="partitionable-devices")._value.get() == 0
    # Without lending the same server is only reported.
    fp.check_at_start(kube, LENDING, [], Log(), "plugin")


def test_the_start_check_turns_a_failed_probe_into_a_clear_exit() -> None:
    kube = FakeKube(["v1"], devicetaintrules=KubeError(403, "Forbidden", "cannot create"))
    with pytest.raises(SystemExit, match="scaler: cannot tell what the API server serves"):
        fp.check_at_start(kube, fp.Probes(DRIVER, taint_rules=True), [], Log(), "scaler")
