"""Pool slices in vendor-driver mode (pool_publisher.publish with a Fabric's vendorDriver)."""

from __future__ import annotations

from dataclasses import replace

from api.v1alpha1 import VendorDriver
from composable_dra.model import names
from pool_publisher.publish import (
    desired_pools,
    plan_pools,
    pool_slices,
    vendor_config_error,
)
from tests.unit.pool_publisher.test_pool_publisher import inventory, view

VENDOR = VendorDriver(
    name="gpu.vendor.example",
    attribute_names={"model": "architecture"},
    attributes={"type": "gpu", "productName": "forced"},
)


def test_vendor_pools_carry_the_vendors_driver_and_attribute_names():
    pools = desired_pools(replace(view(inventory()), vendor=VENDOR), set())
    [s] = pool_slices(pools["fab/zone-2"], 1, names.DRIVER)
    assert s["spec"]["driver"] == "gpu.vendor.example"
    dev = s["spec"]["devices"][0]
    attrs = {k: v["string"] for k, v in dev["attributes"].items()}
    assert attrs["architecture"] == "H100" and "model" not in attrs  # renamed
    assert attrs["type"] == "gpu"
    assert attrs["productName"] == "forced"  # an extra wins over ours
    assert attrs["blockID"] == "gpu-6" and attrs["uuid"] == "u-6"
    # The reschedule path needs the failure condition the scaler sets.
    assert names.FABRIC_DEVICE_RESCHEDULE in dev["bindingFailureConditions"]


def test_switching_a_fabric_to_vendor_mode_rewrites_its_pools():
    plain = desired_pools(view(inventory()), set())
    first = plan_pools(plain, [], names.DRIVER)
    vendor = desired_pools(replace(view(inventory()), vendor=VENDOR), set())
    second = plan_pools(vendor, first.apply, names.DRIVER, first.generations)
    assert {s["spec"]["driver"] for s in second.apply} == {"gpu.vendor.example"}
    # A slice's driver is immutable: new names, and the old slices are deleted.
    old = {s["metadata"]["name"] for s in first.apply}
    assert not old & {s["metadata"]["name"] for s in second.apply}
    assert set(second.delete) == old
    assert all(s["spec"]["pool"]["generation"] == 2 for s in second.apply)


def test_attribute_names_that_a_slice_would_refuse_are_a_config_error():
    assert vendor_config_error(None) is None
    assert vendor_config_error(VENDOR) is None
    bad = VENDOR.model_copy(update={"attributes": {"not-an-identifier": "x"}})
    assert "not-an-identifier" in (vendor_config_error(bad) or "")
    long = VENDOR.model_copy(update={"attribute_names": {"model": "a" * 33}})
    assert vendor_config_error(long) is not None
