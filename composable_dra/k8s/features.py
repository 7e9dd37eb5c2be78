"""What the API server serves of the DRA features the suite builds on: the decisions.

Discovery lists API versions and resources, never fields, and the API server drops a field
whose feature gate is off without a word. So each field is probed by a server-side dry-run
create (nothing is stored) and looked for in the answer: these pure functions build the
probes and read the answers; ``composable_dra/k8s/feature_probe.py`` sends them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from composable_dra.model import names

GROUP = "resource.k8s.io"
VERSION = "v1"  # the one version of the group every component writes
PROBE_NAME = "composable-dra-feature-probe"
PROBE_CONDITION = "ComposableDraProbe"
PROBE_TAINT = f"{names.PREFIX}/feature-probe"


class Feature(enum.Enum):
    """A feature the suite uses; the value is the metric's ``feature`` label."""

    RESOURCE_V1 = "resource-v1"
    BINDING_CONDITIONS = "binding-conditions"
    PARTITIONABLE_DEVICES = "partitionable-devices"
    DEVICE_TAINTS = "device-taints"
    DEVICE_TAINT_RULES = "device-taint-rules"


@dataclass(frozen=True)
class About:
    """How a refusal names a feature: what it is and what turns it on."""

    what: str
    needs: str


ABOUT: Mapping[Feature, About] = {
    Feature.RESOURCE_V1: About(
        f"the {GROUP}/{VERSION} API", "Kubernetes v1.34 or later (GA, on by default)"
    ),
    Feature.BINDING_CONDITIONS: About(
        "device binding conditions (bindingConditions, bindsToNode)",
        "feature gate DRADeviceBindingConditions (beta, on by default from v1.36; "
        "alpha and off in v1.34-v1.35)",
    ),
    Feature.PARTITIONABLE_DEVICES: About(
        "partitionable devices (perDeviceNodeSelection, shared counters)",
        "feature gate DRAPartitionableDevices (beta, on by default from v1.36; "
        "alpha and off in v1.35)",
    ),
    Feature.DEVICE_TAINTS: About(
        "device taints in ResourceSlices",
        "feature gate DRADeviceTaints (GA in v1.37; beta, on by default in v1.36; "
        "alpha and off in v1.35)",
    ),
    Feature.DEVICE_TAINT_RULES: About(
        f"DeviceTaintRules ({GROUP}/{VERSION})",
        "Kubernetes v1.37 (feature gate DRADeviceTaintRules, GA; v1.36 serves them only as "
        "v1beta2, off by default)",
    ),
}


@dataclass(frozen=True)
class ApiFeatures:
    """What one API server was found to serve (``present``) of what was probed
    (``probed``), with the group's versions and, per absent feature, why."""

    versions: tuple[str, ...]
    probed: frozenset[Feature]
    present: frozenset[Feature]
    why: Mapping[Feature, str]

    def missing(self, required: Iterable[Feature]) -> list[Feature]:
        """The ``required`` features this server lacks, in declaration order."""
        need = set(required)
        return [f for f in Feature if f in need and f not in self.present]

    def gauge(self) -> dict[str, int]:
        """The metric's value per probed feature: 1 present, 0 absent."""
        return {f.value: int(f in self.present) for f in Feature if f in self.probed}

    def summary(self) -> dict[str, Any]:
        """The fields of the component's one log line."""
        return {
            "resource_versions": ",".join(self.versions) or "none",
            "uses": ",".join(f.value for f in Feature if f in self.present & self.probed),
            "missing": ",".join(f.value for f in Feature if f in self.probed - self.present),
        }


class MissingFeature(RuntimeError):
    """A component asked for something this API server does not serve."""


# What each use needs: a component refuses at start a use it was asked for without them.
NEEDS: Mapping[str, tuple[Feature, ...]] = {
    "the suite": (Feature.RESOURCE_V1,),
    # The remote-lease devices are per-device, consume counters, and bind to the
    # borrower once RemoteGPUReady is set (docs/architecture.md, Lending a GPU).
    "lending (--lend)": (Feature.PARTITIONABLE_DEVICES, Feature.BINDING_CONDITIONS),
}


def refusal(found: ApiFeatures, uses: Iterable[str]) -> MissingFeature | None:
    """The error that refuses the first of ``uses`` (keys of NEEDS) this server cannot
    serve, naming each missing feature, what turns it on and why the probe found it
    absent; None when it serves them all."""
    for use in uses:
        missing = found.missing(NEEDS[use])
        if missing:
            parts = [
                f"{ABOUT[m].what}: needs {ABOUT[m].needs}; {found.why.get(m, 'not served')}"
                for m in missing
            ]
            return MissingFeature(
                f"{use} needs what this API server does not serve: " + " | ".join(parts)
            )
    return None


def served_versions(group: Any) -> tuple[str, ...]:
    """The versions an APIGroup discovery document lists; () for anything else."""
    if not isinstance(group, dict) or not isinstance(group.get("versions"), list):
        return ()
    found = [v.get("version") for v in group["versions"] if isinstance(v, dict)]
    return tuple(v for v in found if isinstance(v, str))


# -- probes: the bodies, and what must come back -------------------------------------


def slice_probe(driver: str, pool: str, placement: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceSlice whose one device carries binding conditions and a taint, placed as
    the writer's own slices are (``{"nodeName": n}`` for a node's plugin, ``{"allNodes":
    True}``), so that it passes the same admission as they do."""
    device = {
        "name": "probe",
        "bindsToNode": True,
        "bindingConditions": [PROBE_CONDITION],
        "bindingFailureConditions": [f"{PROBE_CONDITION}Failed"],
        "taints": [{"key": PROBE_TAINT, "value": "probe", "effect": "NoSchedule"}],
    }
    return _slice(driver, pool, dict(placement), [device])


def partition_probe(driver: str, node: str) -> dict[str, Any]:
    """A lending node's per-device slice: one device on ``node`` that consumes a counter."""
    device = {
        "name": "probe",
        "nodeName": node,
        "consumesCounters": [{"counterSet": "probe", "counters": {"probe": {"value": "1"}}}],
    }
    return _slice(driver, node, {"perDeviceNodeSelection": True}, [device])


def taint_rule_probe(driver: str) -> dict[str, Any]:
    """A DeviceTaintRule as the scaler and the operator write them."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DeviceTaintRule",
        "metadata": {"generateName": f"{PROBE_NAME}-"},
        "spec": {
            "deviceSelector": {"driver": driver, "pool": PROBE_NAME, "device": "probe"},
            "taint": {"key": PROBE_TAINT, "value": "probe", "effect": "NoSchedule"},
        },
    }


def _slice(
    driver: str, pool: str, placement: dict[str, Any], devices: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{PROBE_NAME}-"},
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": 0, "resourceSliceCount": 1},
            **placement,
            "devices": devices,
        },
    }


def _first_device(answer: Any) -> dict[str, Any]:
    spec = answer.get("spec") if isinstance(answer, dict) else None
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if isinstance(devices, list) and devices and isinstance(devices[0], dict):
        return devices[0]
    return {}


def slice_features(answer: Any) -> dict[Feature, bool]:
    """Which of the slice probe's fields the dry run kept."""
    device = _first_device(answer)
    return {
        Feature.BINDING_CONDITIONS: bool(device.get("bindingConditions"))
        and device.get("bindsToNode") is True,
        Feature.DEVICE_TAINTS: bool(device.get("taints")),
    }


def partition_kept(answer: Any, node: str) -> bool:
    """Whether the dry run kept the per-device node selection and the counters."""
    spec = answer.get("spec") if isinstance(answer, dict) else None
    device = _first_device(answer)
    return (
        isinstance(spec, dict)
        and spec.get("perDeviceNodeSelection") is True
        and device.get("nodeName") == node
        and bool(device.get("consumesCounters"))
    )


def taint_rule_kept(answer: Any) -> bool:
    """Whether the dry run kept the rule's taint."""
    spec = answer.get("spec") if isinstance(answer, dict) else None
    taint = spec.get("taint") if isinstance(spec, dict) else None
    return isinstance(taint, dict) and taint.get("key") == PROBE_TAINT
