"""Fake Nodes: Node objects with a Ready condition and no kubelet behind them."""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes import client


def create_node(
    api: client.ApiClient,
    name: str,
    *,
    system_uuid: str | None = None,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Create a Ready node that the scheduler can place pods on."""
    core = client.CoreV1Api(api)
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", **(allocatable or {})}
    core.create_node(
        body={
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    **(labels or {}),
                },
            },
        }
    )
    node_info = {
        "machineID": uuid.uuid4().hex,
        "systemUUID": system_uuid or str(uuid.uuid4()),
        "bootID": str(uuid.uuid4()),
        "kernelVersion": "6.1.0",
        "osImage": "fake",
        "containerRuntimeVersion": "fake://1",
        "kubeletVersion": "v1.37.1",
        "kubeProxyVersion": "",
        "operatingSystem": "linux",
        "architecture": "amd64",
    }
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "fake node of the local control plane",
                }
            ],
            "nodeInfo": node_info,
        }
    }
    result: dict[str, Any] = api.sanitize_for_serialization(core.patch_node_status(name, status))
    return result


def delete_node(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).delete_node(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
