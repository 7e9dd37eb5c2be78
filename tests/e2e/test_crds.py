"""The CRDs refuse bad specs at the real API server (schema and CEL)."""

from __future__ import annotations

from typing import Any

import pytest

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.kube import Kube, KubeError, path
from testbed import vendor_plugin
from testbed.crds import install_crds


@pytest.fixture(scope="module")
def crds(kube_json: Kube) -> Kube:
    install_crds(kube_json)
    return kube_json


def resource(name: str, **spec: Any) -> dict[str, Any]:
    body = {"fabric": "lab", "deviceID": "gpu-blk-1", "targetNode": "node-a", **spec}
    return {
        "apiVersion": API_VERSION,
        "kind": "ComposableResource",
        "metadata": {"name": name},
        "spec": {k: v for k, v in body.items() if v is not None},
    }


def refused(kube: Kube, plural: str, body: dict[str, Any]) -> str:
    with pytest.raises(KubeError) as exc:
        kube.create(path(API_VERSION, plural), body)
    assert exc.value.status == 422, exc.value
    return exc.value.message


def test_valid_resource_gets_defaults(crds: Kube, unique: str) -> None:
    created = crds.create(path(API_VERSION, "composableresources"), resource(f"ok-{unique}"))
    assert created["spec"]["forceDetach"] is False
    crds.delete(path(API_VERSION, "composableresources", f"ok-{unique}"))


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({"targetNode": None}, "targetNode"),
        ({"targetNode": "Not_A_Node"}, "targetNode"),
        ({"deviceID": ""}, "deviceID"),
        # A device id goes into a Redfish URL: one path segment, never a traversal.
        ({"deviceID": "../../Systems/node-1"}, "deviceID"),
        ({"deviceID": ".."}, "deviceID"),
        ({"deviceID": "gpu-1?x=1"}, "deviceID"),
        ({"deviceID": "gpu 1"}, "deviceID"),
        ({"forceDetach": "yes"}, "forceDetach"),
    ],
)
def test_bad_resource_specs_are_refused(
    crds: Kube, unique: str, spec: dict[str, Any], complaint: str
) -> None:
    assert complaint in refused(crds, "composableresources", resource(f"bad-{unique}", **spec))


def test_target_node_and_device_are_immutable(crds: Kube, unique: str) -> None:
    name = f"imm-{unique}"
    crds.create(path(API_VERSION, "composableresources"), resource(name))
    try:
        for field in ("targetNode", "deviceID"):
            with pytest.raises(KubeError) as exc:
                crds.merge_patch(
                    path(API_VERSION, "composableresources", name), {"spec": {field: "other"}}
                )
            assert exc.value.status == 422
            assert f"{field} is immutable" in exc.value.message
    finally:
        crds.delete(path(API_VERSION, "composableresources", name))


def fabric(name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "backend": "redfish-composition",
        "endpoint": "https://fm.example:8443",
        "credentialsSecret": {"name": "fm", "namespace": "ops"},
        **spec,
    }
    return {"apiVersion": API_VERSION, "kind": "Fabric", "metadata": {"name": name}, "spec": body}


def test_fabric_defaults_and_refusals(crds: Kube, unique: str) -> None:
    created = crds.create(path(API_VERSION, "fabrics"), fabric(f"f-{unique}"))
    assert created["spec"]["nodeMapping"] == {"by": "systemUUID"}
    assert created["spec"]["insecureSkipTLSVerify"] is False
    assert created["spec"]["pollIntervalSeconds"] == 30
    crds.delete(path(API_VERSION, "fabrics", f"f-{unique}"))

    assert "annotation is required" in refused(
        crds, "fabrics", fabric(f"g-{unique}", nodeMapping={"by": "annotation"})
    )
    assert "endpoint" in refused(crds, "fabrics", fabric(f"h-{unique}", endpoint="fm:8443"))
    for endpoint in ("https://admin:secret@fm.example:8443", "https://token@fm.example/"):
        assert "endpoint must not carry credentials" in refused(
            crds, "fabrics", fabric(f"k-{unique}", endpoint=endpoint)
        )
    # An '@' after the host is part of the path, not credentials.
    with_at = crds.create(
        path(API_VERSION, "fabrics"), fabric(f"l-{unique}", endpoint="https://fm.example/a@b")
    )
    assert with_at["spec"]["endpoint"] == "https://fm.example/a@b"
    crds.delete(path(API_VERSION, "fabrics", f"l-{unique}"))
    assert "backend" in refused(crds, "fabrics", fabric(f"i-{unique}", backend="vendor-x"))
    assert "pollIntervalSeconds" in refused(
        crds, "fabrics", fabric(f"j-{unique}", pollIntervalSeconds=1)
    )


@pytest.mark.parametrize("selector", [" ", "!x", "a!=b", "x", "a notin (b)", "a="])
def test_a_vendor_restart_selector_must_name_the_plugin(
    crds: Kube, unique: str, selector: str
) -> None:
    """Issue 25.13: each of these matches every pod without the label, so the scaler would
    delete every pod of the namespace on the GPU's node."""
    vendor = {"name": "gpu.nvidia.com", "restart": {"namespace": "ns", "podSelector": selector}}
    body = fabric(f"v-{unique}", vendorDriver=vendor)
    assert "podSelector must name the plugin's pods" in refused(crds, "fabrics", body)


def test_nvidias_kubelet_plugin_selector_is_accepted(crds: Kube, unique: str) -> None:
    vendor = {
        "name": vendor_plugin.DRIVER,
        "restart": {"namespace": vendor_plugin.NAMESPACE, "podSelector": vendor_plugin.SELECTOR},
    }
    crds.create(path(API_VERSION, "fabrics"), fabric(f"w-{unique}", vendorDriver=vendor))
    crds.delete(path(API_VERSION, "fabrics", f"w-{unique}"))


@pytest.mark.parametrize(
    ("sizes", "complaint"),
    [
        ({"size": 5, "maxSize": 4}, "size must be at most maxSize"),
        ({"size": 1, "minSize": 2}, "size must be at least minSize"),
        ({"size": 3, "minSize": 4, "maxSize": 2}, "minSize must not exceed maxSize"),
        ({"size": -1}, "size"),
    ],
)
def test_bad_request_sizes_are_refused(
    crds: Kube, unique: str, sizes: dict[str, int], complaint: str
) -> None:
    body = {
        "apiVersion": API_VERSION,
        "kind": "ComposabilityRequest",
        "metadata": {"name": f"r-{unique}"},
        "spec": {"fabric": "lab", "model": "H100", **sizes},
    }
    assert complaint in refused(crds, "composabilityrequests", body)
