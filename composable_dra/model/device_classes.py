"""The suite's DeviceClasses: every GPU of the driver, and a node's own GPUs only.

A claim that prefers a node's own GPU (``firstAvailable``: local, then the pool) names the
local class in its ``local`` alternative. kube-scheduler checks a device against the
class's selectors before the request's, and stops at the first that fails
(v1.37.1 ``allocator_incubating.go``, ``isSelectable``): a pool device then costs one CEL
evaluation for that alternative, not two (the class's and the claim's), on every node
filtered, for every pod (docs/attach-flow.md, The scheduler's pace).
"""

from __future__ import annotations

from composable_dra.k8s.kube import JSON
from composable_dra.model import names


def any_gpu_selector(driver: str = names.DRIVER) -> str:
    return f'device.driver == "{driver}"'


def local_gpu_selector(driver: str = names.DRIVER) -> str:
    """The driver's devices in the node: not a fabric pool's (those carry ``blockID``) and
    not a lent GPU's remote twin (``attachment`` "remote", which every device of the
    driver states). The pool's test comes first: a pool device costs one check."""
    attrs = f'device.attributes["{driver}"]'
    return (
        f'{any_gpu_selector(driver)} && !("blockID" in {attrs}) && {attrs}.attachment != "remote"'
    )


def device_class(name: str, expression: str) -> JSON:
    return {
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def device_classes(driver: str = names.DRIVER) -> list[JSON]:
    """Both classes, as the chart creates them."""
    return [
        device_class(names.DEVICE_CLASS, any_gpu_selector(driver)),
        device_class(names.LOCAL_DEVICE_CLASS, local_gpu_selector(driver)),
    ]
