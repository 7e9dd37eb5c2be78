"""CoHDI's ComposabilityRequests (``cro.hpsys.ibm.ie.com/v1alpha1``) as ours
(``composable.dra.io/v1alpha1``), for ``composable-dra migrate-cohdi``
(``migrate_cohdi.py``): what we cannot honour is refused, every reason at once, so no
request is half-migrated; docs/operations.md has the mapping.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from api.labels import key_problem, value_problem
from api.v1alpha1 import API_VERSION, DNS_SUBDOMAIN, ComposabilityRequestSpec
from composable_dra.model.validation import problems

COHDI_API = "cro.hpsys.ibm.ie.com/v1alpha1"


class MigrationError(Exception):
    """Input that cannot be migrated; ``reasons`` says each thing, with where."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("\n".join(reasons))
        self.reasons = reasons


# CoHDI's request as its CRD shapes it, strictly typed (a number is not a name): a
# document of another shape is refused with where, never a traceback. Unknown fields of
# ``resource`` are kept to be named; the rest of the document (status, annotations) is
# ignored.
_STRICT = ConfigDict(strict=True, extra="ignore")


class _Metadata(BaseModel):
    model_config = _STRICT
    name: str = ""
    labels: dict[str, str] | None = None


class _Resource(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str | None = None
    model: str | None = None
    size: int | None = None
    force_detach: bool | None = None
    allocation_policy: str | None = None
    target_node: str | None = None
    other_spec: dict[str, Any] | None = None


class _Spec(BaseModel):
    model_config = _STRICT
    resource: _Resource


class _Request(BaseModel):
    model_config = _STRICT
    metadata: _Metadata = _Metadata()
    spec: _Spec


def _items(docs: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for doc in docs:
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "List":
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise MigrationError(["List: items is not a list"])
            out.extend(items)
        else:
            out.append(doc)
    return out


def _where(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{doc.get('kind', '?')} {name if isinstance(name, str) and name else '(no name)'}"


def _label_problems(labels: dict[str, str]) -> list[str]:
    found = [key_problem(k) or value_problem(v) for k, v in sorted(labels.items())]
    return [f"metadata.labels: {p}" for p in found if p]


# Long because it checks each CoHDI field in turn and collects every reason to refuse, so a
# user sees all the problems of a request at once rather than one per run.
def convert(doc: Any, fabric: str, *, spread: bool = False) -> dict[str, Any]:
    """One CoHDI ComposabilityRequest as ours; MigrationError listing every problem."""
    if not isinstance(doc, dict):
        raise MigrationError(["a document that is not a mapping"])
    where = _where(doc)
    if doc.get("apiVersion") != COHDI_API or doc.get("kind") != "ComposabilityRequest":
        hint = (
            ": CoHDI's operator creates those for a request; ours creates its own"
            if doc.get("kind") == "ComposableResource"
            else ""
        )
        raise MigrationError(
            [f"{where}: not a CoHDI ComposabilityRequest ({doc.get('apiVersion')!r}){hint}"]
        )
    try:
        request = _Request.model_validate(doc)
    except ValidationError as exc:
        raise MigrationError([f"{where}: {problems(exc, 'the document')}"]) from None
    name, resource = request.metadata.name, request.spec.resource
    problems_: list[str] = []
    if not re.fullmatch(DNS_SUBDOMAIN, name) or len(name) > 253:
        problems_.append(f"{where}: metadata.name is not a valid object name")
    problems_ += [f"{where}: {p}" for p in _label_problems(request.metadata.labels or {})]
    problems_ += [
        f"{where}: unknown field spec.resource.{k}" for k in sorted(resource.model_extra or {})
    ]
    if resource.type == "cxlmemory":
        problems_.append(f"{where}: type cxlmemory: this suite attaches GPUs only")
    elif resource.type != "gpu":
        problems_.append(f"{where}: type {resource.type!r} is neither gpu nor cxlmemory")
    if not resource.model:
        problems_.append(f"{where}: model is required")
    size = resource.size
    if size is None or not 0 <= size <= 1024:
        problems_.append(f"{where}: size must be an integer from 0 to 1024")
    target = resource.target_node or None
    policy = resource.allocation_policy or "samenode"
    if policy == "samenode" and target is None:
        problems_.append(
            f"{where}: allocation_policy samenode without target_node: CoHDI picks one node "
            "and keeps every device there; ours spreads a request over the nodes. Set "
            "target_node to keep them on one node"
        )
    elif policy == "differentnode" and not spread:
        problems_.append(
            f"{where}: allocation_policy differentnode (at most one device per node): ours "
            "spreads a request, fewest devices first, but may put two on a node when only "
            "it reaches free devices. Pass --spread to accept that, or write one request "
            "per node with target_node"
        )
    elif policy not in ("samenode", "differentnode"):
        problems_.append(f"{where}: allocation_policy {policy!r} is unknown")
    if target is not None and not re.fullmatch(DNS_SUBDOMAIN, target):
        problems_.append(f"{where}: target_node is not a node name")
    if resource.force_detach:
        problems_.append(
            f"{where}: force_detach: shrinking our request never detaches a device that "
            "serves a claim; set spec.forceDetach on a ComposableResource where needed"
        )
    if resource.other_spec:
        problems_.append(
            f"{where}: other_spec (node CPU, memory, storage, pods) has no counterpart: "
            "choose the node with target_node"
        )
    if problems_:
        raise MigrationError(problems_)
    spec: dict[str, Any] = {"fabric": fabric, "model": resource.model, "size": size}
    if target is not None:
        spec["targetNode"] = target
    try:  # our schema's own checks, as a last line
        ComposabilityRequestSpec.model_validate(spec)
    except ValidationError as exc:
        raise MigrationError([f"{where}: {problems(exc, 'spec')}"]) from None
    metadata: dict[str, Any] = {"name": name}
    if request.metadata.labels:
        metadata["labels"] = dict(request.metadata.labels)
    return {
        "apiVersion": API_VERSION,
        "kind": "ComposabilityRequest",
        "metadata": metadata,
        "spec": spec,
    }


def convert_all(docs: Iterable[Any], fabric: str, *, spread: bool = False) -> list[dict[str, Any]]:
    """Every request converted, or MigrationError with the reasons of all that cannot be."""
    out: list[dict[str, Any]] = []
    reasons: list[str] = []
    for doc in _items(docs):
        try:
            out.append(convert(doc, fabric, spread=spread))
        except MigrationError as exc:
            reasons += exc.reasons
    if reasons:
        raise MigrationError(reasons)
    if not out:
        raise MigrationError(["no ComposabilityRequest in the input"])
    return out
