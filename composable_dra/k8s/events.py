"""Kubernetes Events (core/v1) as the controllers post them: for people, never for logic."""

from __future__ import annotations

import contextlib
import datetime
import uuid
from typing import Any

from composable_dra.k8s.kube import KubeError, path
from composable_dra.k8s.resource_slices import RESOURCE_API

JSON = dict[str, Any]


def claim_object(name: str, namespace: str, uid: str) -> JSON:
    """The ``involvedObject`` of an Event about a ResourceClaim."""
    return {
        "kind": "ResourceClaim",
        "apiVersion": RESOURCE_API,
        "name": name,
        "namespace": namespace,
        "uid": uid,
    }


def event_body(
    involved: JSON, namespace: str, kind: str, reason: str, message: str, component: str
) -> JSON:
    """An Event about ``involved`` (kind, apiVersion, name, uid[, namespace])."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "metadata": {
            "name": f"{involved['name']}.{uuid.uuid4().hex[:12]}",
            "namespace": namespace,
        },
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1000],
        "type": kind,
        "source": {"component": component},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "reportingComponent": component,
        "reportingInstance": component,
    }


def post(
    kube: Any, involved: JSON, namespace: str, kind: str, reason: str, message: str, component: str
) -> None:
    """Post an Event; a failure is dropped (Events are for people, never for logic)."""
    body = event_body(involved, namespace, kind, reason, message, component)
    with contextlib.suppress(KubeError):
        kube.create(path("v1", "events", namespace=namespace), body)
