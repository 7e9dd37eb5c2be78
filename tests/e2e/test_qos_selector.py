"""The QoS selector (``qos.cel_selector``, ``composable-dra qos-selector``) as the real
kube-scheduler evaluates it, against a hand-written slice of one fake node: no plugin is
needed to publish a device's load.

Issue 25.10: a mistyped driver name used to read an absent attribute domain, which CEL
sees as empty, so every device passed as "publishes no load".
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from composable_dra.k8s.kube import Kube, path
from composable_dra.lending import qos
from composable_dra.model import names
from testbed.nodes import create_node, delete_node
from testbed.objects import create_claim_pod
from tests.e2e.test_lend import (
    RESOURCE,
    allocated,
    delete_pod_and_claim,
    wait_allocated,
    wait_unschedulable,
)

pytestmark = pytest.mark.e2e
# A device whose host is as busy as it gets: no headroom, the job runs twice as long.
LOADED = {qos.HOST_SLOWDOWN: 1000, qos.HEADROOM: 0}
STRICT = qos.QosProfile(transfer=0.5, tolerance=0.1, host_load=0.0)  # cannot bear it
EASY = qos.QosProfile(transfer=0.5, tolerance=10.0, host_load=0.0)  # can


@pytest.fixture
def loaded_node(kube_json: Kube, device_class: str, unique: str) -> Iterator[str]:
    """A fake node whose one GPU of our driver publishes ``LOADED``."""
    node = f"qos-{unique}"
    create_node(kube_json.api, node)
    attributes = {"uuid": {"string": f"GPU-{unique}"}} | {k: {"int": v} for k, v in LOADED.items()}
    body = {
        "metadata": {"name": f"{node}-gpus"},
        "spec": {
            "driver": names.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": attributes}],
        },
    }
    kube_json.create(path(RESOURCE, "resourceslices"), body)
    yield node
    kube_json.delete(path(RESOURCE, "resourceslices", f"{node}-gpus"))
    delete_node(kube_json.api, node)


def qos_request(device_class: str, profile: qos.QosProfile, domain: str) -> dict[str, object]:
    selector = qos.cel_selector(profile, domain)
    return {"deviceClassName": device_class, "selectors": [{"cel": {"expression": selector}}]}


@pytest.mark.versions("1.35", "1.36")
def test_a_mistyped_driver_name_matches_no_device(
    kube_json: Kube, namespace: str, device_class: str, loaded_node: str
) -> None:
    kube, ns = kube_json, namespace
    create_claim_pod(
        kube, ns, "typo", loaded_node, qos_request(device_class, STRICT, "gpu.composabel.dra.io")
    )
    wait_unschedulable(kube, ns, "typo")
    # Under the right name the strict profile is refused by the load, the easy one fits:
    # the same selector the scheduler compiled, and it reads the published load.
    create_claim_pod(
        kube, ns, "strict", loaded_node, qos_request(device_class, STRICT, names.DRIVER)
    )
    wait_unschedulable(kube, ns, "strict")
    create_claim_pod(kube, ns, "easy", loaded_node, qos_request(device_class, EASY, names.DRIVER))
    assert wait_allocated(kube, ns, "easy") == (loaded_node, "gpu-0")
    assert allocated(kube, ns, "typo") is None
    for name in ("typo", "strict", "easy"):
        delete_pod_and_claim(kube, ns, name)
