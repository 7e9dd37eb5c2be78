"""Shared builders for the kubelet plugin's unit tests."""

from __future__ import annotations

import uuid
from typing import Any

from dra_driver.device_source import DeviceInfo

DRIVER = "gpu.composable.dra.io"
NODE = "node-a"


def gpu(i: int, **kw: Any) -> DeviceInfo:
    return DeviceInfo(
        name=f"gpu-{i}",
        uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000",
        product_name="NVIDIA A100-SXM4-80GB",
        model="A100",
        memory_bytes=80 * 2**30,
        **kw,
    )


def claim(
    name: str = "c1",
    namespace: str = "default",
    uid: str | None = None,
    results: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    allocated: bool = True,
    status_devices: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {
            "devices": {
                "results": results
                if results is not None
                else [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}],
                "config": config or [],
            }
        }
    if status_devices is not None:
        obj["status"]["devices"] = status_devices
    return obj


def result(device: str, request: str = "gpu", **kw: Any) -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": NODE, "device": device, **kw}


def gpu_config(**fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "gpu.composable.dra.io/v1alpha1",
        "kind": "GpuConfig",
        **fields,
    }


def opaque(
    parameters: dict[str, Any],
    requests: list[str] | None = None,
    driver: str = DRIVER,
    source: str = "FromClaim",
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {"driver": driver, "parameters": parameters},
    }
    if requests:
        entry["requests"] = requests
    return entry
