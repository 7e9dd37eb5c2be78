"""What the suite's two ResourceSlice writers share (the node plugin, dra_driver/slices.py;
the pool publisher, pool_publisher/publish.py): how a slice they want is compared with the
one on the server (on the fields they set, never what the server adds), and how a plan's
slices are written."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from composable_dra.k8s.kube import JSON, Kube, NotFound, path
from composable_dra.model import names

RESOURCE_API = "resource.k8s.io/v1"
# Set by a touch (composable_dra/k8s/wake.py): a write that changes nothing the scheduler
# allocates from, and that it still takes as a ResourceSlice update.
WOKEN_ANNOTATION = f"{names.PREFIX}/woken-at"


def common_fields(obj: JSON) -> tuple[JSON, JSON, tuple[Any, ...]]:
    """(labels, spec, the owners, driver and pool of the slice), the fields both writers set
    on every slice; each compares its own further fields from the labels and spec."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    pool = spec.get("pool") or {}
    owners = sorted(
        (o.get("kind"), o.get("name"), o.get("uid")) for o in meta.get("ownerReferences") or []
    )
    common = (
        owners,
        spec.get("driver"),
        pool.get("name"),
        pool.get("generation"),
        pool.get("resourceSliceCount"),
    )
    return meta.get("labels") or {}, spec, common


def write_slices(kube: Kube, apply: Iterable[JSON], delete: Iterable[str], manager: str) -> None:
    """Server-side apply ``apply`` as field manager ``manager``, then delete ``delete``.

    An apply, not an update: what others set on our slices (a label, an annotation) stays.
    It costs the API server more (for a 64-device pool slice 28-30 ms of CPU against
    19-20 ms for an unconditional update, docs/attach-flow.md)."""
    for obj in apply:
        kube.apply(path(RESOURCE_API, "resourceslices", obj["metadata"]["name"]), obj, manager)
    for name in delete:
        kube.delete(path(RESOURCE_API, "resourceslices", name))


def touch_slice(kube: Kube, name: str) -> bool:
    """One write to slice ``name`` that changes only an annotation (the time, to the
    microsecond, so that it always changes): any update of a slice requeues the pods the
    scheduler's DRA plugin found unschedulable. False when the slice is gone."""
    stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds")
    body = {"metadata": {"annotations": {WOKEN_ANNOTATION: stamp}}}
    try:
        kube.merge_patch(path(RESOURCE_API, "resourceslices", name), body)
    except NotFound:
        return False
    return True
