"""A fabric that picks the GPU (Fsas FM with attachBy model, as CoHDI's FM client and CI
mock have it): the backend against the emulator in that mode, and the pure slot and
recovery decisions (composable_dra/fabric/slots.py)."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.v1alpha1 import FabricSpec
from composable_dra.fabric import backend as b
from composable_dra.fabric import errors as fe
from composable_dra.fabric.fsas import FsasFabricManagerBackend
from composable_dra.fabric.registry import FACTORIES, FabricConfigError, SecretKeys
from composable_dra.fabric.slots import (
    SlotHold,
    is_slot,
    recover_pick,
    slot_holds,
    slot_name,
    slot_prefix,
    with_slots,
)
from composable_operator.fabric_status import free_devices
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import gpu_uuid
from tests.unit.composable_dra.fabric.test_fsas_backend import CONFIG as IDENTITY_FM
from tests.unit.composable_dra.fabric.test_fsas_backend import CREDS, N1, N2, N3
from tests.unit.conftest import fsas_emulator

H100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"
# As CoHDI's CI mock of the FM: it picks, and lists no resources.
CONFIG = dataclasses.replace(IDENTITY_FM, attach_by_model=True, list_resources=False)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    yield from fsas_emulator(tmp_path_factory, CONFIG)


@pytest.fixture
def fm(emu: EmulatorProcess) -> Iterator[FsasFabricManagerBackend]:
    emu.reset()
    backend = FsasFabricManagerBackend(
        emu.url,
        CREDS,
        tenant_uuid=CONFIG.tenant,
        realm=CONFIG.realm,
        attach_by_model=True,
        models=(H100, L40S),
    )
    yield backend
    backend.close()


def test_picking_fm_inventory_is_counts_and_attached_gpus(
    fm: FsasFabricManagerBackend, emu: EmulatorProcess
) -> None:
    assert b.picker(fm) is fm
    inv = fm.inventory()
    assert set(inv.hosts) == {N1, N2, N3}
    assert inv.devices == {}  # nothing attached, and free GPUs have no identity here
    # A machine's fabric is its first zone: node-3 alone is in zone-2 for the FM.
    assert inv.free_counts == {
        ("zone-1", H100): 4,
        ("zone-1", L40S): 1,
        ("zone-2", H100): 1,
        ("zone-2", L40S): 2,
    }
    assert inv.zones["zone-2"].hosts == {N3}

    picked = fm.attach_model(H100, N1)
    assert (picked.state, picked.host, picked.model) == ("attached", N1, H100)
    assert picked.uuid == gpu_uuid(picked.id)
    assert emu.state()["blocks"][picked.id]["system"] == "node-1"
    inv = fm.inventory()
    assert inv.free_counts[("zone-1", H100)] == 3
    assert inv.devices[picked.id].host == N1
    assert [d.id for d in fm.host_devices(N1)] == [picked.id]
    assert fm.device(picked.id) == picked

    with pytest.raises(fe.FabricError, match="picks the GPU"):
        fm.attach("gpu-2", N1)  # by id: not what this FM does
    assert fm.detach(picked.id, N1) is None
    assert fm.device(picked.id) is None  # on no machine: unknown to a counting FM
    assert fm.inventory().free_counts[("zone-1", H100)] == 4


def test_picking_fm_out_of_gpus_is_insufficient(fm: FsasFabricManagerBackend) -> None:
    assert fm.attach_model(L40S, N3).host == N3
    assert fm.attach_model(L40S, N3).host == N3
    with pytest.raises(fe.InsufficientError):
        fm.attach_model(L40S, N3)
    assert len(fm.host_devices(N3)) == 2


def _inv(counts: dict[tuple[str, str], int], attached: tuple[str, ...] = ()) -> b.Inventory:
    devices = {
        a: b.Device(id=a, model="m", zone="z", uuid=f"u-{a}", state="attached", host="h")
        for a in attached
    }
    zones = {"z": b.Zone("z", frozenset({"h"}), frozenset(devices))}
    return b.Inventory(hosts={}, devices=devices, zones=zones, free_counts=counts)


def _slots(inv: b.Inventory) -> list[str]:
    return sorted(d for d in inv.zones["z"].devices if is_slot(d))


def test_free_counts_become_slots_that_carry_no_identity() -> None:
    out = with_slots(_inv({("z", "m"): 3}), [], set())
    assert _slots(out) == [slot_name("z", "m", i) for i in range(3)]
    d = out.devices[slot_name("z", "m", 0)]
    assert (d.model, d.zone, d.uuid, d.state) == ("m", "z", "", "free")
    # Slot names are DNS labels whatever the zone and model say.
    assert slot_prefix("Zone/ä", "NVIDIA H100 80GB").startswith("slot-")
    assert slot_name("z", "m", 0) != slot_name("z", "n", 0)


def test_an_allocated_slot_stays_and_its_gpu_is_counted_once() -> None:
    s3 = slot_name("z", "m", 3)
    # Allocated, not yet attached: the FM still counts its GPU among the free 4.
    before = with_slots(_inv({("z", "m"): 4}), [SlotHold(s3, None)], {s3})
    assert len(_slots(before)) == 4 and s3 in _slots(before)
    # Attached (its pick is on a machine in this read): the count fell to 3.
    after = with_slots(_inv({("z", "m"): 3}, ("gpu-9",)), [SlotHold(s3, "gpu-9")], {s3})
    assert len(_slots(after)) == 4 and s3 in _slots(after)
    assert "gpu-9" not in _slots(after)
    # Pick recorded but this (older) read does not show it attached: counted as spoken for.
    stale = with_slots(_inv({("z", "m"): 4}), [SlotHold(s3, "gpu-9")], {s3})
    assert len(_slots(stale)) == 4


def test_a_released_slot_name_is_not_handed_out_while_its_resource_lives() -> None:
    s0 = slot_name("z", "m", 0)
    out = with_slots(_inv({("z", "m"): 2}, ("gpu-9",)), [SlotHold(s0, "gpu-9")], set())
    assert s0 not in _slots(out)  # released: its GPU is a local device now, not in the pool
    assert _slots(out) == [slot_name("z", "m", 1), slot_name("z", "m", 2)]


@settings(max_examples=150)
@given(
    free=st.integers(0, 8),
    holds=st.lists(st.tuples(st.integers(0, 12), st.booleans(), st.booleans()), max_size=8),
)
def test_slots_fuzz(free: int, holds: list[tuple[int, bool, bool]]) -> None:
    """Published slots are every allocated one plus the GPUs left over; names are unique
    and none that a resource holds is offered free."""
    by_index = {i: (landed, alloc) for i, landed, alloc in holds}
    hs = [
        SlotHold(slot_name("z", "m", i), f"g{i}" if landed else None)
        for i, (landed, _) in by_index.items()
    ]
    allocated = {slot_name("z", "m", i) for i, (_, alloc) in by_index.items() if alloc}
    attached = tuple(f"g{i}" for i, (landed, _) in by_index.items() if landed)
    out = _slots(with_slots(_inv({("z", "m"): free}, attached), hs, allocated))
    pending = sum(1 for landed, _ in by_index.values() if not landed)
    offered = [s for s in out if s not in allocated]
    assert allocated <= set(out)
    assert len(offered) == max(0, free - pending)
    assert not set(offered) & {h.slot for h in hs}


def test_slot_holds_read_from_resources() -> None:
    s = slot_name("z", "m", 0)
    resources = [
        {"spec": {"fabric": "f", "deviceID": s}, "status": {"fabricDeviceID": "gpu-1"}},
        {"spec": {"fabric": "f", "deviceID": "gpu-2"}, "status": {}},  # not a slot
        {"spec": {"fabric": "g", "deviceID": s}, "status": {}},  # another fabric
        {"spec": {"fabric": "f", "deviceID": s + "1"}, "status": {"phase": "Detached"}},
    ]
    assert slot_holds(resources, "f") == [SlotHold(s, "gpu-1")]


def _dev(i: str, model: str = "m") -> b.Device:
    return b.Device(id=i, model=model, zone="z", uuid="", state="attached", host="h")


def test_recover_pick_finds_the_new_unclaimed_gpu_of_the_model() -> None:
    now = [_dev("a"), _dev("b"), _dev("c"), _dev("d", "other")]
    # a was there before; c is another resource's; d is of another model: b is ours.
    assert recover_pick(["a"], now, {"c"}, "m") == _dev("b")
    assert recover_pick(["a", "b"], now, {"c"}, "m") is None  # nothing landed
    assert recover_pick([], [_dev("y"), _dev("x")], set(), "m") == _dev("x")  # stable


def test_registry_builds_a_picking_backend_only_with_models_to_count() -> None:
    keys = {"client_id": "c", "client_secret": "x"}
    data = {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()}
    secret = SecretKeys({"metadata": {"namespace": "ns", "name": "s"}, "data": data})
    fsas = {"tenantUUID": "t-1", "realm": "cdi", "attachBy": "model", "models": [H100]}
    spec = FabricSpec.model_validate(
        {
            "backend": "fsas-fm",
            "endpoint": "https://fm.example",
            "fsas": fsas,
            "credentialsSecret": {"namespace": "ns", "name": "s"},
        }
    )
    backend = FACTORIES["fsas-fm"](spec, secret, None)
    assert isinstance(backend, FsasFabricManagerBackend) and backend.models == (H100,)
    assert b.picker(backend) is backend
    assert spec.fsas is not None
    none = spec.model_copy(update={"fsas": spec.fsas.model_copy(update={"models": []})})
    with pytest.raises(FabricConfigError, match="models"):
        FACTORIES["fsas-fm"](none, secret, None)
    identity = spec.model_copy(
        update={"fsas": spec.fsas.model_copy(update={"attach_by": "resource"})}
    )
    assert b.picker(FACTORIES["fsas-fm"](identity, secret, None)) is None


def test_fabric_status_counts_a_picking_fabrics_free_gpus() -> None:
    inv = _inv({("z", "m"): 3}, ("gpu-9",))
    assert free_devices(inv) == [{"model": "m", "zone": "z", "count": 3}]
