"""``composable-dra migrate-cohdi FILE``: CoHDI ComposabilityRequests to ours.

Reads CoHDI's ``cro.hpsys.ibm.ie.com/v1alpha1`` ComposabilityRequests (one YAML document,
several, or a ``List`` as ``kubectl get -o yaml`` writes it) and writes ours
(``composable.dra.io/v1alpha1``). What we cannot honour is refused, every reason at once
and nothing written, so no request is half-migrated; docs/operations.md has the mapping.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

COHDI_API = "cro.hpsys.ibm.ie.com/v1alpha1"
_KNOWN = {
    "type",
    "model",
    "size",
    "force_detach",
    "allocation_policy",
    "target_node",
    "other_spec",
}


class MigrationError(Exception):
    """Input that cannot be migrated; ``reasons`` says each thing, with where."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("\n".join(reasons))
        self.reasons = reasons


def _items(docs: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for doc in docs:
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "List":
            out.extend(doc.get("items") or [])
        else:
            out.append(doc)
    return out


def convert(doc: Any, fabric: str, *, spread: bool = False) -> dict[str, Any]:
    """One CoHDI ComposabilityRequest as ours; MigrationError listing every problem."""
    from pydantic import ValidationError

    from api.v1alpha1 import API_VERSION, DNS_SUBDOMAIN, ComposabilityRequestSpec

    if not isinstance(doc, dict):
        raise MigrationError(["a document that is not a mapping"])
    name = str((doc.get("metadata") or {}).get("name") or "")
    where = f"{doc.get('kind', '?')} {name or '(no name)'}"
    if doc.get("apiVersion") != COHDI_API or doc.get("kind") != "ComposabilityRequest":
        hint = (
            ": CoHDI's operator creates those for a request; ours creates its own"
            if doc.get("kind") == "ComposableResource"
            else ""
        )
        raise MigrationError(
            [f"{where}: not a CoHDI ComposabilityRequest ({doc.get('apiVersion')}){hint}"]
        )
    problems: list[str] = []
    if not re.fullmatch(DNS_SUBDOMAIN, name) or len(name) > 253:
        problems.append(f"{where}: metadata.name is not a valid object name")
    resource = (doc.get("spec") or {}).get("resource")
    if not isinstance(resource, dict):
        raise MigrationError([f"{where}: spec.resource is missing"])
    problems += [
        f"{where}: unknown field spec.resource.{k}" for k in sorted(resource.keys() - _KNOWN)
    ]
    rtype = resource.get("type")
    if rtype == "cxlmemory":
        problems.append(f"{where}: type cxlmemory: this suite attaches GPUs only")
    elif rtype != "gpu":
        problems.append(f"{where}: type {rtype!r} is neither gpu nor cxlmemory")
    model = resource.get("model")
    if not isinstance(model, str) or not model:
        problems.append(f"{where}: model is required")
    size = resource.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= 1024:
        problems.append(f"{where}: size must be an integer from 0 to 1024")
    target = resource.get("target_node") or None
    policy = resource.get("allocation_policy") or "samenode"
    if policy == "samenode" and target is None:
        problems.append(
            f"{where}: allocation_policy samenode without target_node: CoHDI picks one node "
            "and keeps every device there; ours spreads a request over the nodes. Set "
            "target_node to keep them on one node"
        )
    elif policy == "differentnode" and not spread:
        problems.append(
            f"{where}: allocation_policy differentnode (at most one device per node): ours "
            "spreads a request, fewest devices first, but may put two on a node when only "
            "it reaches free devices. Pass --spread to accept that, or write one request "
            "per node with target_node"
        )
    elif policy not in ("samenode", "differentnode"):
        problems.append(f"{where}: allocation_policy {policy!r} is unknown")
    if target is not None and (
        not isinstance(target, str) or not re.fullmatch(DNS_SUBDOMAIN, target)
    ):
        problems.append(f"{where}: target_node is not a node name")
    if resource.get("force_detach"):
        problems.append(
            f"{where}: force_detach: shrinking our request never detaches a device that "
            "serves a claim; set spec.forceDetach on a ComposableResource where needed"
        )
    if resource.get("other_spec"):
        problems.append(
            f"{where}: other_spec (node CPU, memory, storage, pods) has no counterpart: "
            "choose the node with target_node"
        )
    if problems:
        raise MigrationError(problems)
    spec: dict[str, Any] = {"fabric": fabric, "model": model, "size": size}
    if target is not None:
        spec["targetNode"] = target
    try:  # our schema's own checks, as a last line
        ComposabilityRequestSpec.model_validate(spec)
    except ValidationError as exc:
        raise MigrationError([f"{where}: {exc}"]) from None
    metadata: dict[str, Any] = {"name": name}
    labels = (doc.get("metadata") or {}).get("labels")
    if isinstance(labels, dict) and labels:
        metadata["labels"] = labels
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="CoHDI YAML ('-' reads standard input)")
    parser.add_argument("--fabric", required=True, help="the Fabric the requests draw from")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="accept allocation_policy differentnode as our spread (not a guarantee)",
    )
    parser.add_argument("-o", "--output", help="write here instead of standard output")


def run(args: argparse.Namespace) -> int:
    import yaml

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
        converted = convert_all(yaml.safe_load_all(text), args.fabric, spread=args.spread)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"migrate-cohdi: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    except yaml.YAMLError as exc:
        print(f"migrate-cohdi: {args.file} is not YAML: {exc}", file=sys.stderr)
        return 2
    except MigrationError as exc:
        print("migrate-cohdi: nothing written; cannot migrate:", file=sys.stderr)
        for reason in exc.reasons:
            print(f"  - {reason}", file=sys.stderr)
        return 1
    out = yaml.safe_dump_all(converted, sort_keys=False)
    if args.output:
        Path(args.output).write_text(out, encoding="utf-8")
    else:
        sys.stdout.write(out)
    return 0
