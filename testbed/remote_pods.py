"""A claim for a remote GPU and a pod that runs the matmul workload with it.

What the lease end-to-end tests and ``hack/bench/remote_claims.py`` create: the claim
selects a lent device (``attachment == "remote"``); the pod, pinned to its node, runs
``python -m remote_gpu.workloads.matmul ARGS`` once (restartPolicy Never), which the
kubelet emulator starts as a local process with the claim's CDI edits.
"""

from __future__ import annotations

from collections.abc import Sequence

from composable_dra.k8s.kube import JSON
from composable_dra.model import names

DRIVER = names.DRIVER
DEVICE_CLASS = names.DEVICE_CLASS
REMOTE = f'device.attributes["{DRIVER}"].attachment == "remote"'


def matmul_claim_and_pod(
    name: str, node: str, args: Sequence[str], device_class: str = DEVICE_CLASS
) -> tuple[JSON, JSON]:
    """(ResourceClaim, Pod), both named ``name``; create the claim first."""
    command = ["python", "-m", "remote_gpu.workloads.matmul", *args]
    return remote_claim_and_pod(name, node, command, device_class)


def remote_claim_and_pod(
    name: str, node: str, command: Sequence[str], device_class: str = DEVICE_CLASS, count: int = 1
) -> tuple[JSON, JSON]:
    """(ResourceClaim for ``count`` remote GPUs, Pod running ``command`` once with them),
    both named ``name``; create the claim first."""
    request: JSON = {
        "deviceClassName": device_class,
        "selectors": [{"cel": {"expression": REMOTE}}],
    }
    if count != 1:
        request["count"] = count
    claim: JSON = {
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }
    container = {
        "name": "main",
        "image": "composable-dra:latest",
        "command": list(command),
        "resources": {"claims": [{"name": "gpu"}]},
    }
    pod: JSON = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }
    return claim, pod
