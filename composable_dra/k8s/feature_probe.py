"""Asks the API server, at a component's start, what it serves of the DRA features the
component writes: discovery for the API version, server-side dry-run creates for the
fields (``composable_dra/k8s/features.py`` builds the probes and reads the answers).

Each component probes only what it writes, with the permission it already holds for it
(a dry run needs the same RBAC and admission as the write): the plugin and the pool
publisher ResourceSlices, the scaler DeviceTaintRules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge

from composable_dra.k8s import features as f
from composable_dra.k8s.kube import KubeError, NotFound, path

API_FEATURE = Gauge(
    "composable_dra_api_feature",
    "DRA features the API server serves, as found at start (1) or not (0), by feature",
    ["feature"],
)
# Answers that mean "this server does not take the probe": the resource is not served, or
# the object is invalid once the server dropped a gated field (a per-device slice without
# its perDeviceNodeSelection has no node selection at all).
_NOT_TAKEN = {404, 422}


class FeatureProbeError(RuntimeError):
    """A probe failed for a reason that says nothing about the feature (no permission,
    the API server down)."""


@dataclass(frozen=True)
class Probes:
    """What a component writes, so what it probes. ``node``: a node's plugin, whose slices
    name it (``spec.nodeName``, or its pool with per-device node selection); None: slices
    for all nodes (the pool publisher's probe)."""

    driver: str
    node: str | None = None
    slices: bool = False  # binding conditions, device taints
    partitions: bool = False  # partitionable devices (a node's plugin only)
    taint_rules: bool = False


def detect(kube: Any, probes: Probes) -> f.ApiFeatures:
    """What the API server serves of ``probes``; FeatureProbeError when it cannot tell."""
    versions = f.served_versions(_discovery(kube))
    results: dict[f.Feature, tuple[bool, str]] = {
        f.Feature.RESOURCE_V1: (
            f.VERSION in versions,
            f"it serves {f.GROUP} versions [{', '.join(versions)}]",
        )
    }
    results.update(_probe_all(kube, probes, f.VERSION in versions))
    return f.ApiFeatures(
        versions=versions,
        probed=frozenset(results),
        present=frozenset(k for k, (ok, _) in results.items() if ok),
        why={k: why for k, (ok, why) in results.items() if not ok},
    )


def report(found: f.ApiFeatures, log: Any, component: str) -> None:
    """The component's one log line and the metric, for what it probed."""
    for feature, value in found.gauge().items():
        API_FEATURE.labels(feature=feature).set(value)
    log.info("api features", component=component, **found.summary())


def check_at_start(
    kube: Any, probes: Probes, uses: list[str], log: Any, component: str
) -> f.ApiFeatures:
    """Detect and report; SystemExit, with the message naming what is missing, when the
    server lacks what one of ``uses`` (keys of features.NEEDS) needs or cannot be probed."""
    try:
        found = detect(kube, probes)
    except FeatureProbeError as exc:
        raise SystemExit(f"{component}: cannot tell what the API server serves: {exc}") from None
    report(found, log, component)
    refused = f.refusal(found, ["the suite", *uses])
    if refused is not None:
        log.error("refused", component=component, reason=str(refused))
        raise SystemExit(f"{component}: {refused}")
    return found


# A probe: the plural it is created in, its body, and what its answer shows (None: refused).
Probe = tuple[str, dict[str, Any], Callable[[Any], dict[f.Feature, bool]]]


def _wanted(probes: Probes) -> list[Probe]:
    out: list[Probe] = []
    node = probes.node
    if probes.slices:
        placement = {"nodeName": node} if node else {"allNodes": True}
        body = f.slice_probe(probes.driver, node or f.PROBE_NAME, placement)
        out.append(("resourceslices", body, f.slice_features))
    if probes.partitions and node:
        out.append(
            (
                "resourceslices",
                f.partition_probe(probes.driver, node),
                lambda a: {f.Feature.PARTITIONABLE_DEVICES: f.partition_kept(a, node)},
            )
        )
    if probes.taint_rules:
        out.append(
            (
                "devicetaintrules",
                f.taint_rule_probe(probes.driver),
                lambda a: {f.Feature.DEVICE_TAINT_RULES: f.taint_rule_kept(a)},
            )
        )
    return out


def _probe_all(kube: Any, probes: Probes, served: bool) -> dict[f.Feature, tuple[bool, str]]:
    out: dict[f.Feature, tuple[bool, str]] = {}
    for plural, body, read in _wanted(probes):
        if not served:
            out.update({k: (False, f"{f.GROUP}/{f.VERSION} is not served") for k in read(None)})
            continue
        answer, refused = _dry_run(kube, plural, body)
        for k, kept in read(answer).items():
            out[k] = (kept, refused or "the API server dropped the field (feature gate off)")
    return out


def _discovery(kube: Any) -> Any:
    try:
        return kube.get(f"/apis/{f.GROUP}")
    except NotFound:
        return None
    except KubeError as exc:
        raise FeatureProbeError(f"discovery of {f.GROUP}: {exc}") from exc


def _dry_run(kube: Any, plural: str, body: dict[str, Any]) -> tuple[Any, str]:
    """The dry-run create's answer and ""; or None and why the server did not take it."""
    url = path(f"{f.GROUP}/{f.VERSION}", plural)
    try:
        return kube.request("POST", url, body=body, query={"dryRun": "All"}), ""
    except KubeError as exc:
        if exc.status in _NOT_TAKEN:
            # The server's message can be long (every field it found wrong): a line is enough.
            return None, f"the API server refused the probe: {str(exc)[:300]}"
        raise FeatureProbeError(f"dry-run create of {plural}: {exc}") from exc
