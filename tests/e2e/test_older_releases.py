"""Pool GPUs on the older releases (v1.35, v1.36), as each serves them: a real node of the
same release (the upstream kubelet, containerd, runc), every component a process.

With device binding conditions (v1.36: beta, on) a pool-only claim is attached in one
scheduling cycle, as on v1.37. Without them (v1.35: alpha, off) the API server drops
``bindingConditions`` and ``bindsToNode``, and a pool device would let the scheduler bind
the pod before any GPU is attached: the pool publisher holds the pools back from the
scheduler (pool_publisher/served.py), the pool-only claim waits and is told why (a
Warning Event naming the gate), and the warm standby serves claims with local GPUs. On
both, the standby's GPU serves a claim that prefers a local GPU. (v1.37: test_attach_flow,
test_standby.)
"""

from __future__ import annotations

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.feature_probe import Probes, detect
from composable_dra.k8s.features import Feature
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from device_scaler.standby import STANDBY_LABEL
from pool_publisher.served import HELD_BACK_LABEL, POOL_HELD_BACK
from testbed.harness import Suite
from testbed.realnodes import describe_nodes, gpu_env, suite_pod
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite

pytestmark = [pytest.mark.e2e, pytest.mark.versions("1.35", "1.36", default=False)]
RESOURCE = "resource.k8s.io/v1"
HOSTS = ("node-1",)
POOL_ONLY = {
    "devices": {
        "requests": [
            {
                "name": "gpu",
                "exactly": {
                    "deviceClassName": names.DEVICE_CLASS,
                    "selectors": [
                        {
                            "cel": {
                                "expression": f'device.attributes["{names.DRIVER}"].attachment'
                                ' == "pool"'
                            }
                        }
                    ],
                },
            }
        ]
    }
}


def binding_conditions(kube: Kube) -> bool:
    """What the pool publisher found at start: does this server keep binding conditions?"""
    return Feature.BINDING_CONDITIONS in detect(kube, Probes(names.DRIVER, slices=True)).present


def claim_events(suite: Suite, namespace: str, name: str) -> list[JSON]:
    items: list[JSON] = suite.kube.get(
        path("v1", "events", namespace=namespace),
        fieldSelector=f"involvedObject.name={name},involvedObject.kind=ResourceClaim",
    )["items"]
    return items


def held_back(slice_: JSON) -> bool:
    terms = slice_["spec"]["nodeSelector"]["nodeSelectorTerms"]
    return all(
        any(r["key"] == HELD_BACK_LABEL for r in t.get("matchExpressions") or []) for t in terms
    )


def assert_pool_only_claim(suite: Suite, namespace: str, with_conditions: bool) -> None:
    """The pool-only claim: attached in one cycle, or waiting and told why."""
    suite_pod(suite, namespace, "pool", claim={"spec": POOL_ONLY})
    if with_conditions:
        wait_for(lambda: suite.running(namespace, "pool"), 90, "the pool-only pod to run")
        [r] = suite.claim(namespace, "pool")["status"]["allocation"]["devices"]["results"]
        assert r["bindingConditions"] == [names.FABRIC_DEVICE_READY], r
        assert suite.composed().get(r["device"]) == "node-1"
        return
    wait_for(
        lambda: [
            e for e in claim_events(suite, namespace, "pool") if e["reason"] == POOL_HELD_BACK
        ],
        60,
        "the pool-only claim's Event saying why no pool serves it",
        describe=suite.describe,
    )
    [event] = [e for e in claim_events(suite, namespace, "pool") if e["reason"] == POOL_HELD_BACK]
    assert event["type"] == "Warning" and "DRADeviceBindingConditions" in event["message"]
    # Held back: published (the standby's blocks), never allocated, the pod never bound.
    slices = suite.pool_slices()
    assert slices and all(held_back(s) for s in slices), slices
    assert not any("bindingConditions" in d for s in slices for d in s["spec"]["devices"])
    assert not suite.claim(namespace, "pool").get("status", {}).get("allocation")
    assert not suite.pod(namespace, "pool")["spec"].get("nodeName")
    assert suite.composed() == {}


def test_pool_gpus_as_the_release_serves_them_and_the_standby_on_both(
    make_suite: MakeSuite, namespace: str
) -> None:
    suite = make_suite(hosts=HOSTS, real_hosts=HOSTS)
    with_conditions = binding_conditions(suite.kube)
    version = suite.kube.get("/version")["gitVersion"]
    assert with_conditions == (not version.startswith("v1.35.")), version
    assert_pool_only_claim(suite, namespace, with_conditions)

    # The warm standby attaches a GPU of the pool to node-1 ahead of any claim ...
    standby = {"maxPerZone": 1, "minPerZone": 1}
    suite.kube.merge_patch(
        path(API_VERSION, "fabrics", suite.fabric), {"spec": {"standby": standby}}
    )

    def standby_uuids() -> set[str]:
        return {
            normalize_uuid(r["status"]["deviceUUID"])
            for r in suite.resources()
            if STANDBY_LABEL in r["metadata"].get("labels", {})
            and (r.get("status") or {}).get("phase") == "Online"
        }

    def published_standby() -> set[str]:
        local = {
            normalize_uuid(d["attributes"]["uuid"]["string"]) for d in suite.local_devices("node-1")
        }
        return standby_uuids() & local

    wait_for(
        published_standby, 90, "a standby GPU published as node-1's own", describe=suite.describe
    )
    ready = published_standby()
    # ... and a claim that prefers a local GPU gets it at once: no binding condition.
    suite_pod(suite, namespace, "local")
    wait_for(
        lambda: suite.running(namespace, "local"),
        60,
        "the prefer-local pod to run",
        describe=lambda: describe_nodes(suite),
    )
    [r] = suite.claim(namespace, "local")["status"]["allocation"]["devices"]["results"]
    assert r["request"] == "gpu/local" and not r.get("bindingConditions"), r
    assert normalize_uuid(gpu_env(suite, namespace, "local")["COMPOSABLE_GPU_UUIDS"]) in ready
