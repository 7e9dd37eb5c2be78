"""The objects the scaler writes: their names and bodies."""

from __future__ import annotations

import hashlib
import re

from api.v1alpha1 import API_VERSION, ClaimRef, ComposableResourceSpec
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import format_time
from composable_dra.model import names
from composable_dra.model.names import ANN_EXPIRES, ANN_POOL, ANN_POOL_DEVICE, QUARANTINE_LABEL
from device_scaler import standby as sb
from device_scaler.decide.actions import Quarantine

MANAGED_LABEL = f"{names.PREFIX}/managed-by"
MANAGED_VALUE = "scaler"


def resource_name(claim_uid: str, pool: str, device: str) -> str:
    """The ComposableResource of one allocated pool device: deterministic, so a restart or
    a duplicate event finds the one already created instead of making another."""
    digest = hashlib.sha256(f"{claim_uid}/{pool}/{device}".encode()).hexdigest()[:12]
    stem = re.sub(r"[^a-z0-9-]+", "-", device.lower()).strip("-")[:40].strip("-") or "dev"
    return f"{stem}-{digest}"


def quarantine_rule_name(pool: str, device: str) -> str:
    digest = hashlib.sha256(f"{pool}/{device}".encode()).hexdigest()[:12]
    return f"quarantine-{digest}"


def resource_body(
    name: str,
    claim: ClaimRef,
    pool: str,
    device: str,
    fabric: str,
    block: str,
    model: str,
    node: str,
) -> JSON:
    """The resource of a claim's pool device. It carries the operator's finalizer from
    the start: the operator sends no attach before it is on, and kopf adding it was a
    write and a watch round trip on every attach's path (docs/attach-flow.md, Timing)."""
    spec = ComposableResourceSpec(
        fabric=fabric,
        device_id=block,
        target_node=node,
        model=model or None,
        claim_ref=ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid),
    ).model_dump(by_alias=True, exclude_defaults=True)
    return {
        "apiVersion": API_VERSION,
        "kind": "ComposableResource",
        "metadata": {
            "name": name,
            "labels": {
                MANAGED_LABEL: MANAGED_VALUE,
                names.LABEL_CLAIM_UID: claim.uid,
                names.LABEL_NODE: node[:63],
            },
            "annotations": {ANN_POOL: pool, ANN_POOL_DEVICE: device},
            "finalizers": [names.FINALIZER],
        },
        "spec": spec,
    }


def standby_body(new: sb.NewStandby) -> JSON:
    """A standby GPU's resource: no claim; the node's plugin publishes the GPU as an idle
    local device once it is Online, and the idle rule returns it like any other."""
    spec = ComposableResourceSpec(
        fabric=new.fabric,
        device_id=new.block.block,
        target_node=new.node,
        model=new.block.model or None,
    ).model_dump(by_alias=True, exclude_defaults=True)
    return {
        "apiVersion": API_VERSION,
        "kind": "ComposableResource",
        "metadata": {
            "name": new.name,
            "labels": {
                MANAGED_LABEL: MANAGED_VALUE,
                sb.STANDBY_LABEL: "true",
                names.LABEL_NODE: new.node[:63],
            },
            "annotations": {ANN_POOL: new.block.pool, ANN_POOL_DEVICE: new.block.device},
            "finalizers": [names.FINALIZER],
        },
        "spec": spec,
    }


def quarantine_body(q: Quarantine, driver: str) -> JSON:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": quarantine_rule_name(q.pool, q.device),
            "labels": {QUARANTINE_LABEL: "scaler"},
            "annotations": {ANN_EXPIRES: format_time(q.until)},
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": q.pool, "device": q.device},
            "taint": {
                "key": f"{names.PREFIX}/attach-failed",
                "value": "quarantine",
                "effect": "NoSchedule",
            },
        },
    }
