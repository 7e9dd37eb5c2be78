"""Shared helpers for the tests that run real nodes (tests/e2e/test_real_node*.py)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from composable_dra import names
from composable_dra.kube import JSON, Conflict, Kube, NotFound, path
from hack.localcluster.realnode import RealNode, find_node_binaries
from hack.localcluster.wait import wait_for

RESOURCE = "resource.k8s.io/v1"


def node_binaries() -> Path:
    """The node binaries, built if missing. A real node needs root (mount namespaces,
    runc); under CI=true nothing is skipped: a missing binary is built or the test fails."""
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("a real node needs root (mount namespaces, runc); CI=true runs it")
    return find_node_binaries()


def ensure_device_class(kube: Kube) -> None:
    """The examples' DeviceClass (it may exist from another test)."""
    with contextlib.suppress(Conflict):
        kube.create(
            path(RESOURCE, "deviceclasses"),
            {
                "metadata": {"name": names.DEVICE_CLASS},
                "spec": {
                    "selectors": [{"cel": {"expression": f'device.driver == "{names.DRIVER}"'}}]
                },
            },
        )


def node_slices(kube: Kube, node: str) -> list[JSON]:
    items: list[JSON] = kube.get(
        path(RESOURCE, "resourceslices"),
        fieldSelector=f"spec.nodeName={node},spec.driver={names.DRIVER}",
    )["items"]
    return items


def slice_devices(slices: list[JSON]) -> set[str]:
    return {d["name"] for s in slices for d in s["spec"].get("devices", [])}


def wait_running(kube: Kube, node: RealNode, namespace: str, pod: str, timeout: float = 90) -> JSON:
    pod_path = path("v1", "pods", pod, namespace=namespace)

    def running() -> JSON | None:
        node.check_alive()
        got: JSON = kube.get(pod_path)
        return got if got["status"].get("phase") == "Running" else None

    result: JSON = wait_for(
        running,
        timeout,
        f"pod {pod} to run on {node.name}",
        interval=0.3,
        describe=lambda: f"{kube.get(pod_path).get('status')}\n{node.logs_tail(15)}",
    )
    return result


def wait_output(node: RealNode, namespace: str, pod: str, marker: str) -> str:
    """The container ``main``'s output, once it contains ``marker``."""

    def printed() -> str | None:
        log = node.container_log(namespace, pod, "main")
        return log if marker in log else None

    out: str = wait_for(printed, 30, f"the output of {pod}", describe=node.logs_tail)
    print(f"--- output of {namespace}/{pod} on real node {node.name} ---\n{out}", flush=True)
    return out


def gone(kube: Kube, obj_path: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            kube.get(obj_path)
        except NotFound:
            return True
        return False

    return check


def pod_with_claim(kube: Kube, node: RealNode, namespace: str, name: str) -> None:
    """A claim for one GPU and a pod on ``node`` using it, printing its environment."""
    kube.create(
        path(RESOURCE, "resourceclaims", namespace=namespace),
        {
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS}}
                    ]
                }
            },
        },
    )
    kube.create(
        path("v1", "pods", namespace=namespace),
        {
            "metadata": {"name": name},
            "spec": {
                "hostNetwork": True,
                "nodeSelector": {"kubernetes.io/hostname": node.name},
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "main",
                        "image": node.image,
                        "command": ["sh", "-c", "env; exec sleep 3600"],
                        "resources": {"claims": [{"name": "gpu"}]},
                    }
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            },
        },
    )
