"""Small reads of the API objects the decision looks at: claims, resources, conditions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from composable_dra.model.names import ANN_ADOPTED
from device_scaler.decide.builders import MANAGED_LABEL, MANAGED_VALUE


def meta_of(obj: JSON) -> JSON:
    meta: JSON = obj.get("metadata") or {}
    return meta


def allocation_node(allocation: JSON) -> str | None:
    """The node of a bindsToNode allocation, from its nodeSelector."""
    selector = allocation.get("nodeSelector") or {}
    for term in selector.get("nodeSelectorTerms") or []:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                values = req.get("values") or []
                if len(values) == 1:
                    return str(values[0])
        for req in term.get("matchExpressions") or []:
            if req.get("key") == "kubernetes.io/hostname" and req.get("operator") == "In":
                values = req.get("values") or []
                if len(values) == 1:
                    return str(values[0])
    return None


def find_condition(conds: Iterable[JSON], kind: str) -> JSON | None:
    return next((c for c in conds if c.get("type") == kind), None)


def is_true(conds: Iterable[JSON], kind: str) -> bool:
    c = find_condition(conds, kind)
    return c is not None and c.get("status") == "True"


def status_entry(claim: JSON, driver: str, pool: str, device: str) -> JSON | None:
    for st in (claim.get("status") or {}).get("devices") or []:
        if (st.get("driver"), st.get("pool"), st.get("device")) == (driver, pool, device):
            entry: JSON = st
            return entry
    return None


def same_entry(a: JSON | None, b: JSON) -> bool:
    if a is None:
        return False

    def key(e: JSON) -> Any:
        return (
            sorted((c.get("type"), c.get("status")) for c in e.get("conditions") or []),
            e.get("data") or {},
        )

    return bool(key(a) == key(b))


def our_results(claim: JSON, driver: str) -> list[JSON]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [
        r
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == driver
    ]


def managed(cr: JSON) -> bool:
    """Resources whose release and idle detach are the scaler's: those it created, and
    orphans the operator adopted (one owner for the idle rule)."""
    meta = meta_of(cr)
    return (meta.get("labels") or {}).get(MANAGED_LABEL) == MANAGED_VALUE or (
        meta.get("annotations") or {}
    ).get(ANN_ADOPTED) == "adopt"


def fabric_failure(cr: JSON) -> str | None:
    """The operator's report of a fabric operation that ran and failed, if any."""
    status = cr.get("status") or {}
    attached = find_condition(status.get("conditions") or [], names.ATTACHED)
    if attached and attached.get("status") == "False" and attached.get("reason") == "FabricFailed":
        return str(attached.get("message") or status.get("error") or "fabric operation failed")
    return None


def is_live(cr: JSON) -> bool:
    return not meta_of(cr).get("deletionTimestamp") and (cr.get("status") or {}).get("phase") in (
        None,
        "Attaching",
        "Online",
    )
