"""What a controller's informer keeps of the objects of a large collection (``Informer``'s
``keep=``): the fields its readers use, not whole objects. At 1,000 nodes a controller
watches ~9,000 ResourceClaims and ~1,000 ResourceSlices; most of each object is what no
controller of ours reads (docs/attach-flow.md, Scale)."""

from __future__ import annotations

from composable_dra.k8s.kube import JSON

IDENTITY = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")


def identity(obj: JSON) -> JSON:
    meta = obj.get("metadata") or {}
    return {k: meta[k] for k in IDENTITY if k in meta}


def claim_fields(claim: JSON) -> JSON:
    """A ResourceClaim's identity and its allocation's results (driver, pool, device)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    kept = [{k: r[k] for k in ("driver", "pool", "device") if k in r} for r in results]
    status = {"allocation": {"devices": {"results": kept}}} if allocation else {}
    return {"metadata": identity(claim), "status": status}


def request_classes(claim: JSON) -> list[str]:
    """The DeviceClass names a claim's requests (and their ``firstAvailable`` alternatives)
    ask for, in order: what tells whose driver an unallocated claim waits for."""
    out: list[str] = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        alternatives = [request.get("exactly") or {}, *(request.get("firstAvailable") or [])]
        out.extend(str(a["deviceClassName"]) for a in alternatives if a.get("deviceClassName"))
    return out


def claim_request_fields(claim: JSON) -> JSON:
    """An unallocated claim's request classes in the API's shape (``request_classes`` reads
    it as it reads a whole claim); nothing for an allocated one: thousands of those."""
    if (claim.get("status") or {}).get("allocation"):
        return {}
    requests = [{"exactly": {"deviceClassName": c}} for c in request_classes(claim)]
    return {"devices": {"requests": requests}} if requests else {}


def claim_binding_fields(claim: JSON) -> JSON:
    """``claim_fields`` and, of results with binding conditions, those conditions and the
    claim's status conditions for their devices (type, status, time): what tells an
    allocation the scheduler may still hold in flight (composable_dra/k8s/wake.py). An
    unallocated claim keeps its request classes (``claim_request_fields``)."""
    status = claim.get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    keys = ("driver", "pool", "device", "bindingConditions", "bindingFailureConditions")
    kept = [{k: r[k] for k in keys if k in r} for r in results]
    waiting = {
        (r.get("driver"), r.get("pool"), r.get("device"))
        for r in kept
        if r.get("bindingConditions")
    }
    devices = [
        {
            "driver": st.get("driver"),
            "pool": st.get("pool"),
            "device": st.get("device"),
            "conditions": [
                {k: c[k] for k in ("type", "status", "lastTransitionTime") if k in c}
                for c in st.get("conditions") or []
            ],
        }
        for st in status.get("devices") or []
        if (st.get("driver"), st.get("pool"), st.get("device")) in waiting
    ]
    out: JSON = {"allocation": {"devices": {"results": kept}}} if status.get("allocation") else {}
    if devices:
        out["devices"] = devices
    kept_claim: JSON = {"metadata": identity(claim), "status": out}
    if spec := claim_request_fields(claim):
        kept_claim["spec"] = spec
    return kept_claim


def slice_uuid_fields(resource_slice: JSON) -> JSON:
    """A ResourceSlice's identity, node, driver, pool name and each device's name and
    ``uuid`` attribute: what finds the names a GPU is published under on a node."""
    spec = resource_slice.get("spec") or {}
    devices = []
    for d in spec.get("devices") or []:
        kept: JSON = {"name": d.get("name")}
        uuid = (d.get("attributes") or {}).get("uuid")
        if uuid is not None:
            kept["attributes"] = {"uuid": uuid}
        devices.append(kept)
    pool = spec.get("pool") or {}
    kept_spec: JSON = {k: spec[k] for k in ("nodeName", "driver") if k in spec}
    kept_spec["pool"] = {k: pool[k] for k in ("name",) if k in pool}
    kept_spec["devices"] = devices
    return {"metadata": identity(resource_slice), "spec": kept_spec}


def own_slice_fields(resource_slice: JSON) -> JSON:
    """A node's own slice (``spec.nodeName``) as ``slice_uuid_fields``; any other slice (a
    fabric pool's, a lending node's per-device one) whole: the scaler reads a pool
    device's attributes, but of a node's own GPUs only which name has which UUID."""
    if (resource_slice.get("spec") or {}).get("nodeName"):
        return slice_uuid_fields(resource_slice)
    return resource_slice


def node_labels(node: JSON) -> JSON:
    """Of a Node, its name and labels: what selecting nodes by label reads."""
    meta = node.get("metadata") or {}
    return {"metadata": {k: meta[k] for k in ("name", "resourceVersion", "labels") if k in meta}}
