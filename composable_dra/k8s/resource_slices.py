"""What the suite's two ResourceSlice writers share (the node plugin, dra_driver/slices.py;
the pool publisher, pool_publisher/publish.py): how a slice they want is compared with the
one on the server (on the fields they set, never what the server adds), and how a plan's
slices are written."""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

from composable_dra.k8s.kube import JSON, Conflict, Kube, NotFound, path
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


def write_slices(
    kube: Kube,
    apply: Iterable[JSON],
    delete: Iterable[str],
    manager: str,
    observed: Iterable[JSON] = (),
) -> None:
    """Write each of ``apply`` as field manager ``manager``, then delete ``delete``.

    A slice among ``observed`` (the writer's last copies) is updated from that copy: our
    spec and owners, its labels and annotations with ours over them, its resourceVersion,
    so what others set stays and a write that crossed theirs is refused (Conflict), as
    upstream's ResourceSlice controller writes. A refused, missing or unseen slice is
    server-side applied. The update costs the API server about two thirds of an apply (for
    a 64-device slice 19-20 ms of CPU against 28-30 ms, docs/attach-flow.md)."""
    apply = list(apply)
    seen = {o["metadata"]["name"]: o for o in observed} if apply else {}
    for obj in apply:
        url = path(RESOURCE_API, "resourceslices", obj["metadata"]["name"])
        old = seen.get(obj["metadata"]["name"])
        if old is not None and old.get("metadata", {}).get("resourceVersion"):
            try:
                kube.replace(url, over(old, obj), manager)
                continue
            except (Conflict, NotFound):
                pass
        kube.apply(url, obj, manager)
    for name in delete:
        kube.delete(path(RESOURCE_API, "resourceslices", name))


def over(old: JSON, new: JSON) -> JSON:
    """``new`` as an update of ``old``: ``old``'s labels, annotations and finalizers kept
    (ours over them), its resourceVersion as the precondition."""
    was, meta = old["metadata"], new["metadata"]
    merged: JSON = {
        **meta,
        "resourceVersion": was["resourceVersion"],
        "labels": {**(was.get("labels") or {}), **(meta.get("labels") or {})},
        "annotations": {**(was.get("annotations") or {}), **(meta.get("annotations") or {})},
    }
    if was.get("finalizers"):
        merged["finalizers"] = list(was["finalizers"])
    return {**new, "metadata": merged}


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
