"""Vendor-driver mode's decisions (device_scaler.vendor) on top of ``decide``."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from api.v1alpha1 import FabricSpec
from composable_dra.k8s.timestamps import format_time
from composable_dra.model import names
from composable_dra.model.names import ANN_POOL
from device_scaler.decide import (
    DeleteResource,
    PatchResource,
    Quarantine,
    ScalerSnapshot,
    SetDeviceStatus,
    Unquarantine,
    decide,
    resource_name,
)
from device_scaler.vendor import (
    ANN_RESTARTED,
    RESCHEDULE_REASON,
    Rescheduled,
    RestartVendorPlugin,
    VendorMode,
    complete_vendor,
    vendor_modes,
)
from testbed import vendor_plugin
from tests.unit.device_scaler.test_scaler import (
    CFG,
    NOW,
    POOL,
    SlicesKube,
    claim,
    only,
    resource,
    snap,
)

VENDOR = "gpu.vendor.example"
MODE = VendorMode(VENDOR, frozenset({"fab"}), "vendor-ns", "app=vendor-plugin", 30.0)
JSON = dict[str, Any]


def vclaim(**kw: Any) -> JSON:
    c = claim(**kw)
    for r in (c["status"].get("allocation") or {}).get("devices", {}).get("results", []):
        r["driver"] = VENDOR
        if "bindingFailureConditions" in r:
            r["bindingFailureConditions"].append(names.FABRIC_DEVICE_RESCHEDULE)
    return c


def run(s: ScalerSnapshot, mode: VendorMode = MODE) -> list[Any]:
    return complete_vendor(decide(s, replace(CFG, driver=VENDOR)), s, mode)


def online(**kw: Any) -> JSON:
    return resource(phase="Online", uuid="GPU-AAA", **kw)


def test_online_but_not_in_the_vendor_slice_waits_and_restarts_the_plugin_once():
    s = snap([vclaim()], [online()])
    actions = run(s)
    assert not only(actions, SetDeviceStatus)  # no FabricDeviceReady in vendor mode
    assert only(actions, RestartVendorPlugin) == [
        RestartVendorPlugin("node-a", "vendor-ns", "app=vendor-plugin")
    ]
    [patch] = only(actions, PatchResource)
    assert patch.patch["metadata"]["annotations"][ANN_RESTARTED] == format_time(NOW)
    # Restarted 10 s ago: not again before the retry interval; again after it.
    cr = online(annotations={ANN_RESTARTED: format_time(NOW - 10)})
    assert not only(run(snap([vclaim()], [cr])), RestartVendorPlugin)
    assert only(run(snap([vclaim()], [cr], now=NOW + 25)), RestartVendorPlugin)


def test_no_restart_without_restart_settings_for_drivers_that_see_hot_plug():
    mode = VendorMode(VENDOR, frozenset({"fab"}))
    actions = run(snap([vclaim()], [online()]), mode)
    assert actions == []


def test_reschedule_once_the_vendor_lists_the_gpu_on_the_claims_node():
    s = snap([vclaim()], [online()], local={("node-a", "aaa"): "gpu-0"})
    actions = run(s)
    [status] = only(actions, SetDeviceStatus)
    [entry] = status.entries
    assert entry["driver"] == VENDOR and entry["device"] == "gpu-1"
    [cond] = entry["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        names.FABRIC_DEVICE_RESCHEDULE,
        "True",
        RESCHEDULE_REASON,
    )
    assert status.ready == []
    assert only(actions, Rescheduled)[0].local == "gpu-0"
    assert not only(actions, RestartVendorPlugin)
    # Listed on another node only: still waiting.
    other = snap([vclaim()], [online()], local={("node-b", "aaa"): "gpu-0"})
    assert not only(run(other), SetDeviceStatus)


def test_a_rescheduled_claims_resource_is_kept_not_deleted_as_a_failure():
    done = {
        "driver": VENDOR,
        "pool": POOL,
        "device": "gpu-1",
        "conditions": [
            {
                "type": names.FABRIC_DEVICE_RESCHEDULE,
                "status": "True",
                "reason": RESCHEDULE_REASON,
            }
        ],
    }
    s = snap([vclaim(status_devices=[done])], [online()], local={("node-a", "aaa"): "gpu-0"})
    raw = decide(s, replace(CFG, driver=VENDOR))
    name = resource_name("c1", POOL, "gpu-1")
    assert any(isinstance(a, DeleteResource) and a.name == name for a in raw)  # decide alone
    assert not only(run(s), DeleteResource)


def test_failures_stay_failures_and_quarantine_under_the_vendor_driver():
    s = snap([vclaim()], [resource(phase="Failed")])
    actions = run(s)
    [status] = only(actions, SetDeviceStatus)
    assert status.entries[0]["conditions"][0]["type"] == names.FABRIC_DEVICE_FAILED
    assert only(actions, Quarantine) and only(actions, DeleteResource)


def test_expired_quarantines_are_ended_once_by_the_pass_for_our_driver():
    rule = {"metadata": {"name": "q", "annotations": {"composable.dra.io/expires-at": "x"}}}
    s = replace(snap(), quarantines=[rule])
    assert only(decide(s, CFG), Unquarantine)
    assert not only(run(s), Unquarantine)


def test_after_the_reschedule_the_gpu_is_released_and_its_vendor_allocation_counts_as_use():
    # The scheduler deallocated the claim: the resource is released (the pool dropped it).
    s = ScalerSnapshot(
        now=NOW,
        claims=[],
        resources=[online()],
        pool_devices={},
        local_devices={("node-a", "aaa"): "gpu-0"},
    )
    [patch] = only(run(s), PatchResource)
    assert patch.reason == "Released"
    # Allocated again as the vendor's local device gpu-0 on node-a: in use.
    released = online(claim_uid=None, name=resource_name("c1", POOL, "gpu-1"))
    again = vclaim(uid="c2", device="gpu-0", pool="node-a", binding=False)
    [patch] = only(run(replace(s, claims=[again], resources=[released])), PatchResource)
    assert patch.reason == "InUse"


def fabric(name: str, vendor: JSON | None) -> JSON:
    spec: JSON = {
        "backend": "redfish-composition",
        "endpoint": "https://fm.example",
        "credentialsSecret": {"name": "s", "namespace": "ns"},
    }
    if vendor is not None:
        spec["vendorDriver"] = vendor
    return {"metadata": {"name": name}, "spec": spec}


def test_vendor_modes_from_fabrics():
    fabrics = [
        fabric("a", None),
        fabric(
            "c",
            {
                "name": VENDOR,
                "restart": {"namespace": "gpu", "podSelector": "app=x"},
                "restartRetrySeconds": 60,
            },
        ),
        fabric("b", {"name": VENDOR}),
        fabric("d", {"name": "Not_A_Driver"}),  # refused by the model: left out
    ]
    [mode] = vendor_modes(fabrics)
    assert mode == VendorMode(VENDOR, frozenset({"b", "c"}), None, None, 30.0)  # b is first
    assert vendor_modes([fabrics[1]])[0].restart_selector == "app=x"


def test_restarts_only_in_the_allowed_namespace():
    """--vendor-plugin-namespace (the chart's Role): a Fabric naming another namespace
    gets no restarts, and the mode says which namespace it refused."""
    restart = {"name": VENDOR, "restart": {"namespace": "gpu", "podSelector": "app=x"}}
    [allowed] = vendor_modes([fabric("fab", restart)], "gpu")
    assert (allowed.restart_namespace, allowed.restart_selector) == ("gpu", "app=x")
    assert allowed.refused_namespace is None
    [refused] = vendor_modes([fabric("fab", restart)], "nvidia")
    assert refused == VendorMode(VENDOR, frozenset({"fab"}), None, None, 30.0, "gpu")
    s = snap([vclaim()], [online()])
    assert not only(run(s, refused), RestartVendorPlugin)
    assert only(run(s, allowed), RestartVendorPlugin) == [
        RestartVendorPlugin("node-a", "gpu", "app=x")
    ]
    # No restart asked: nothing refused.
    [plain] = vendor_modes([fabric("b", {"name": VENDOR})], "gpu")
    assert plain.refused_namespace is None


class _Synced:
    """A vendor slice informer that has listed: these slices."""

    def __init__(self, items: list[JSON]) -> None:
        self._items = items
        self.synced = threading.Event()
        self.synced.set()

    def items(self) -> list[JSON]:
        return self._items


def test_the_scaler_decides_each_resource_with_its_fabrics_driver_only():
    from device_scaler.scaler import Scaler, ScalerConfig

    # Fabric "fab" is in vendor mode; "own" is not. Each has an Online GPU for a live claim.
    vendor_claim = vclaim(uid="c1")
    own_claim = claim(uid="c2", pool="own/zone-1")
    vendor_cr = online()
    own_cr = resource(
        claim_uid="c2",
        phase="Online",
        uuid="GPU-BBB",
        name=resource_name("c2", "own/zone-1", "gpu-1"),
    )
    own_cr["spec"]["fabric"] = "own"
    own_cr["metadata"]["annotations"].update({ANN_POOL: "own/zone-1"})
    vendor_node_slice = {
        "spec": {
            "driver": VENDOR,
            "nodeName": "node-a",
            "pool": {"name": "node-a"},
            "devices": [{"name": "gpu-0", "attributes": {"uuid": {"string": "aaa"}}}],
        }
    }
    scaler = Scaler(SlicesKube([]), ScalerConfig(CFG))  # type: ignore[arg-type]  # not started
    done: list[Any] = []
    try:
        scaler.claims.items = lambda: [vendor_claim, own_claim]  # type: ignore[method-assign]
        scaler.resources.items = lambda: [vendor_cr, own_cr]  # type: ignore[method-assign]
        scaler.fabrics.items = lambda: [  # type: ignore[method-assign]
            fabric("fab", {"name": VENDOR}),
            fabric("own", None),
        ]
        scaler.vendor_slices[VENDOR] = _Synced([vendor_node_slice])  # type: ignore[assignment]
        scaler._do = done.append  # type: ignore[method-assign,assignment]
        scaler.reconcile()
        scaler.wait_sent(10)
    finally:
        scaler.stop()
    statuses = {a.claim.uid: a for a in only(done, SetDeviceStatus)}
    # The vendor claim is rescheduled; ours gets FabricDeviceReady: neither pass touched
    # the other's resource (our pass would release the vendor's: no allocation of ours).
    assert statuses["c1"].entries[0]["conditions"][0]["type"] == names.FABRIC_DEVICE_RESCHEDULE
    assert statuses["c2"].entries[0]["conditions"][0]["type"] == names.FABRIC_DEVICE_READY
    assert not only(done, PatchResource) and not only(done, DeleteResource)


@pytest.mark.parametrize("selector", [" ", "!x", "a!=b", "x", "a notin (b)", "a=", "a=b=c"])
def test_a_restart_selector_that_names_no_label_value_is_refused(selector: str):
    """Issue 25.13: such a selector matches every pod of the namespace on the GPU's node,
    and the scaler deletes what it matches. The model refuses it, so the Fabric gets no
    vendor mode from the scaler and no pod is deleted."""
    restart = {"name": VENDOR, "restart": {"namespace": "gpu", "podSelector": selector}}
    with pytest.raises(ValidationError, match="podSelector"):
        FabricSpec.model_validate(fabric("fab", restart)["spec"])
    assert vendor_modes([fabric("fab", restart)], "gpu") == []
    s = snap([vclaim()], [online()])
    assert not [a for m in vendor_modes([fabric("fab", restart)]) for a in run(s, m)]


def test_nvidias_kubelet_plugin_selector_is_taken():
    selector = vendor_plugin.SELECTOR
    restart = {
        "name": VENDOR,
        "restart": {"namespace": vendor_plugin.NAMESPACE, "podSelector": selector},
    }
    [mode] = vendor_modes([fabric("fab", restart)], vendor_plugin.NAMESPACE)
    assert mode.restart_selector == selector
