"""Prepare and unprepare decisions, checkpoint and CDI effects (no gRPC, no API server)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from api.v1alpha1 import ClaimRef
from composable_dra.lending.qos import QosProfile
from composable_dra.model import names
from composable_dra.model.gpu_config import ConfigError, parse_parameters
from dra_driver.cdi import CdiDevice, CdiWriter, build_spec, cdi_device_id, resolve
from dra_driver.checkpoint import Checkpoint, CheckpointError
from dra_driver.prepare import ClaimError, ClaimNotFound, Preparer, plan_claim
from testbed.objects import as_scheduler_claim
from tests.unit.dra_driver.plugin_fixtures import (
    DRIVER,
    NODE,
    claim,
    gpu,
    gpu_config,
    opaque,
    result,
)

DEVICES = [gpu(0), gpu(1), gpu(2, device_nodes=("/dev/nvidia2", "/dev/nvidiactl"))]


def ref_of(obj: dict[str, Any]) -> ClaimRef:
    m = obj["metadata"]
    return ClaimRef(namespace=m["namespace"], name=m["name"], uid=m["uid"])


class FakeApi:
    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0

    def add(self, obj: dict[str, Any]) -> ClaimRef:
        self.claims[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return ref_of(obj)

    def __call__(self, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        try:
            return self.claims[(namespace, name)]
        except KeyError:
            raise ClaimNotFound(f"claim {namespace}/{name} not found") from None


class Env:
    def __init__(self, tmp: Path, boot_id: str = "boot-1") -> None:
        self.tmp = tmp
        self.api = FakeApi()
        self.cdi_dir = tmp / "cdi"
        self.devices = list(DEVICES)
        self.preparer = self.restart(boot_id)

    def restart(self, boot_id: str = "boot-1") -> Preparer:
        self.checkpoint = Checkpoint(self.tmp / "state" / "checkpoint.json", boot_id)
        self.preparer = Preparer(
            DRIVER,
            NODE,
            self.api,
            lambda: self.devices,
            self.checkpoint,
            CdiWriter(self.cdi_dir),
        )
        return self.preparer


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_prepare_writes_spec_and_returns_resolvable_ids(env: Env) -> None:
    ref = env.api.add(claim(results=[result("gpu-0"), result("gpu-2", request="other")]))
    out = env.preparer.prepare([ref])[ref.uid]
    assert out.error == ""
    assert [(d.request_names, d.pool_name, d.device_name) for d in out.devices] == [
        (["gpu"], NODE, "gpu-0"),
        (["other"], NODE, "gpu-2"),
    ]
    for dev in out.devices:
        (cdi_id,) = dev.cdi_device_ids
        assert ref.uid in cdi_id
        found = resolve(env.cdi_dir, cdi_id)
        assert found is not None, cdi_id
    edits = resolve(env.cdi_dir, cdi_device_id(ref.uid, "gpu-2"))
    assert edits is not None
    env_vars = dict(e.split("=", 1) for e in edits["containerEdits"]["env"])
    assert env_vars["COMPOSABLE_GPU_UUIDS"] == f"{DEVICES[0].uuid},{DEVICES[2].uuid}"
    assert env_vars["COMPOSABLE_GPU_GPU_2_UUID"] == DEVICES[2].uuid
    nvidia = [names.nvidia_gpu_id(DEVICES[0].uuid), names.nvidia_gpu_id(DEVICES[2].uuid)]
    assert env_vars["NVIDIA_VISIBLE_DEVICES"] == ",".join(nvidia)
    assert edits["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia2"},
        {"path": "/dev/nvidiactl"},
    ]
    spec_files = list(env.cdi_dir.iterdir())
    assert [p.name for p in spec_files] == [f"composable.dra.io-gpu_{ref.uid}.json"]
    assert json.loads(spec_files[0].read_text())["kind"] == "composable.dra.io/gpu"
    assert env.checkpoint.get(ref.uid) is not None
    assert env.checkpoint.get(ref.uid).state == "prepared"  # type: ignore[union-attr]


def test_empty_prepare(env: Env) -> None:
    assert env.preparer.prepare([]) == {}


def test_every_claim_answered_and_failures_stay_per_claim(env: Env) -> None:
    good = env.api.add(claim(name="good"))
    unallocated = env.api.add(claim(name="unallocated", allocated=False))
    replaced = env.api.add(claim(name="replaced"))
    stale = ClaimRef(replaced.namespace, replaced.name, "a-different-uid")
    missing = ClaimRef("default", "missing", "uid-missing")
    out = env.preparer.prepare([good, unallocated, stale, missing])
    assert set(out) == {good.uid, unallocated.uid, stale.uid, missing.uid}
    assert out[good.uid].error == "" and out[good.uid].devices
    assert "not allocated" in out[unallocated.uid].error
    assert "UID" in out[stale.uid].error
    assert "not found" in out[missing.uid].error
    assert env.checkpoint.get(unallocated.uid) is None
    assert list(env.cdi_dir.iterdir()) == [env.preparer._cdi.path_for(good.uid)]


def test_only_our_driver_results(env: Env) -> None:
    foreign = {"request": "nic", "driver": "nic.example.com", "pool": NODE, "device": "eth0"}
    ref = env.api.add(claim(results=[foreign, result("gpu-1")]))
    out = env.preparer.prepare([ref])[ref.uid]
    assert [d.device_name for d in out.devices] == ["gpu-1"]
    only_foreign = env.api.add(claim(name="foreign", results=[foreign]))
    out2 = env.preparer.prepare([only_foreign])[only_foreign.uid]
    assert out2.error == "" and out2.devices == []
    assert not env.preparer._cdi.path_for(only_foreign.uid).exists()


def test_idempotent_across_restart(env: Env) -> None:
    ref = env.api.add(claim())
    first = env.preparer.prepare([ref])[ref.uid]
    spec_before = env.preparer._cdi.path_for(ref.uid).read_bytes()
    gets = env.api.gets
    again = env.restart().prepare([ref])[ref.uid]
    assert again.error == ""
    assert [d.cdi_device_ids for d in again.devices] == [d.cdi_device_ids for d in first.devices]
    assert env.api.gets == gets  # answered from the checkpoint: no new side effects
    assert env.preparer._cdi.path_for(ref.uid).read_bytes() == spec_before
    assert len(list(env.cdi_dir.iterdir())) == 1


def test_removed_spec_restored_on_repeat(env: Env) -> None:
    ref = env.api.add(claim())
    env.preparer.prepare([ref])
    env.preparer._cdi.path_for(ref.uid).unlink()
    out = env.preparer.prepare([ref])[ref.uid]
    assert resolve(env.cdi_dir, out.devices[0].cdi_device_ids[0]) is not None


def test_interrupted_prepare_is_redone(env: Env) -> None:
    """A crash after phase one leaves 'preparing'; the next prepare completes it."""
    ref = env.api.add(claim())
    env.preparer.prepare([ref])
    rec = env.checkpoint.get(ref.uid)
    assert rec is not None
    env.checkpoint.put(rec.model_copy(update={"state": "preparing"}))
    env.preparer._cdi.remove(ref.uid)
    out = env.restart().prepare([ref])[ref.uid]
    assert out.error == ""
    assert env.checkpoint.get(ref.uid).state == "prepared"  # type: ignore[union-attr]
    assert resolve(env.cdi_dir, out.devices[0].cdi_device_ids[0]) is not None


def test_new_boot_id_invalidates_checkpoint(env: Env) -> None:
    ref = env.api.add(claim())
    env.preparer.prepare([ref])
    env.restart(boot_id="boot-2")
    assert env.checkpoint.claims == {}
    env.restart(boot_id="boot-1")
    assert env.checkpoint.claims == {}  # the discarded state does not come back


def test_damaged_checkpoint_is_refused(env: Env) -> None:
    ref = env.api.add(claim())
    env.preparer.prepare([ref])
    path = env.checkpoint.path
    path.write_text(path.read_text().replace('"prepared"', '"preparing"'))
    with pytest.raises(CheckpointError):
        env.restart()


def test_unprepare(env: Env) -> None:
    ref = env.api.add(claim())
    env.preparer.prepare([ref])
    unknown = ClaimRef("default", "never", "uid-never")
    assert env.preparer.unprepare([ref, unknown]) == {ref.uid: "", unknown.uid: ""}
    assert not env.preparer._cdi.path_for(ref.uid).exists()
    assert env.checkpoint.get(ref.uid) is None
    assert env.restart().prepare([]) == {}
    assert env.checkpoint.claims == {}


def test_device_in_use_refused_unless_shared(env: Env) -> None:
    a = env.api.add(claim(name="a"))
    b = env.api.add(claim(name="b"))
    assert env.preparer.prepare([a])[a.uid].error == ""
    err = env.preparer.prepare([b])[b.uid].error
    assert "already prepared for claim" in err and a.uid in err
    assert not env.preparer._cdi.path_for(b.uid).exists()
    env.preparer.unprepare([a])
    assert env.preparer.prepare([b])[b.uid].error == ""


def test_sharing_allowed_when_both_allocations_allow_it(env: Env) -> None:
    shared = [opaque(gpu_config(sharing="Shared"))]
    a = env.api.add(claim(name="a", config=shared))
    b = env.api.add(claim(name="b", config=shared))
    admin = env.api.add(claim(name="admin", results=[result("gpu-0", adminAccess=True)]))
    out = env.preparer.prepare([a, b, admin])
    assert {uid: r.error for uid, r in out.items()} == {a.uid: "", b.uid: "", admin.uid: ""}
    exclusive = env.api.add(claim(name="exclusive"))
    assert "sharing" in env.preparer.prepare([exclusive])[exclusive.uid].error


def test_config_env_applied_per_request(env: Env) -> None:
    configs = [
        opaque(gpu_config(env={"FROM_CLASS": "1", "X": "class"}), source="FromClass"),
        opaque(gpu_config(env={"X": "claim"}), requests=["gpu"]),
        opaque(gpu_config(env={"OTHER": "1"}), requests=["other"]),
        opaque({"anything": True}, driver="nic.example.com"),  # another driver's: ignored
    ]
    ref = env.api.add(claim(config=list(reversed(configs[:2])) + configs[2:]))
    out = env.preparer.prepare([ref])[ref.uid]
    assert out.error == ""
    dev = resolve(env.cdi_dir, out.devices[0].cdi_device_ids[0])
    assert dev is not None
    env_vars = dict(e.split("=", 1) for e in dev["containerEdits"]["env"])
    assert env_vars["FROM_CLASS"] == "1" and env_vars["X"] == "claim"
    assert "OTHER" not in env_vars


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"apiVersion": "gpu.composable.dra.io/v1alpha1", "kind": "NicConfig"}, "unsupported"),
        ({"apiVersion": "v2", "kind": "GpuConfig"}, "unsupported"),
        (gpu_config(sharing="Sometimes"), "sharing"),
        (gpu_config(bogus=1), "bogus"),
        (gpu_config(env={"1BAD": "x"}), "not a valid environment variable"),
        (gpu_config(env={"COMPOSABLE_GPU_UUIDS": "x"}), "set by the driver"),
        (gpu_config(env={"GOOD\n": "x"}), "not a valid environment variable"),
        (gpu_config(env={"A": "x\x00y"}), "contains a NUL or a line break"),
        (gpu_config(env={"A": "x\ny"}), "contains a NUL or a line break"),
        (gpu_config(env={"A": "x\r"}), "contains a NUL or a line break"),
        ("not an object", "must be an object"),
    ],
)
def test_bad_config_fails_that_claim_only(env: Env, parameters: Any, message: str) -> None:
    bad = env.api.add(claim(name="bad", config=[opaque(parameters)]))
    good = env.api.add(claim(name="good", results=[result("gpu-1")]))
    out = env.preparer.prepare([bad, good])
    assert message in out[bad.uid].error
    assert out[good.uid].error == ""
    with pytest.raises(ConfigError):
        parse_parameters(parameters)


def test_pool_device_maps_by_uuid_from_claim_status() -> None:
    pool_result = {"request": "gpu", "driver": DRIVER, "pool": "fabric-1", "device": "block-7"}
    obj = claim(
        results=[pool_result],
        status_devices=[
            {
                "driver": DRIVER,
                "pool": "fabric-1",
                "device": "block-7",
                "data": {"uuid": DEVICES[1].uuid},
            }
        ],
    )
    (planned,) = plan_claim(obj, ref_of(obj), DRIVER, NODE, DEVICES, {})
    assert planned.device.name == "gpu-1" and planned.device_name == "block-7"
    no_status = claim(results=[pool_result])
    with pytest.raises(ClaimError, match="no UUID"):
        plan_claim(no_status, ref_of(no_status), DRIVER, NODE, DEVICES, {})


def test_pool_device_uuid_matches_in_any_form_of_the_same_gpu() -> None:
    """The fabric may say "GPU-<UUID>" (an Fsas FM's res_serial_num, NVML) where the
    node's source says the bare UUID in lower case (Redfish): the same GPU."""
    pool_result = {"request": "gpu", "driver": DRIVER, "pool": "fabric-1", "device": "slot-1"}
    bare = DEVICES[1].uuid.removeprefix("GPU-").lower()
    obj = claim(
        results=[pool_result],
        status_devices=[
            {"driver": DRIVER, "pool": "fabric-1", "device": "slot-1", "data": {"uuid": bare}}
        ],
    )
    (planned,) = plan_claim(obj, ref_of(obj), DRIVER, NODE, DEVICES, {})
    assert planned.device.name == "gpu-1"


def test_missing_device_fails(env: Env) -> None:
    ref = env.api.add(claim(results=[result("gpu-9")]))
    assert "not present" in env.preparer.prepare([ref])[ref.uid].error


def test_prepare_and_unprepare_are_serialized(tmp_path: Path) -> None:
    env = Env(tmp_path)
    active = 0
    peak = 0
    guard = threading.Lock()
    inner = env.api

    def slow_get(namespace: str, name: str) -> dict[str, Any]:
        nonlocal active, peak
        with guard:
            active += 1
            peak = max(peak, active)
        try:
            threading.Event().wait(0.01)  # widen the window a race would need
            return inner(namespace, name)
        finally:
            with guard:
                active -= 1

    env.preparer._get_claim = slow_get
    refs = [env.api.add(claim(name=f"c{i}", results=[result(f"gpu-{i % 3}")])) for i in range(12)]
    errors: list[str] = []

    def worker(r: ClaimRef) -> None:
        for _ in range(3):
            res = env.preparer.prepare([r])[r.uid]
            if res.error and "already prepared" not in res.error:
                errors.append(res.error)
            env.preparer.unprepare([r])

    threads = [threading.Thread(target=worker, args=(r,)) for r in refs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 1
    assert errors == []
    assert env.checkpoint.claims == {}
    assert list(env.cdi_dir.iterdir()) == []


def test_metrics_observe_prepare_and_unprepare(env: Env) -> None:
    from prometheus_client import REGISTRY

    def value(name: str, labels: dict[str, str]) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    ok_before = value("composable_dra_plugin_prepare_seconds_count", {"result": "ok"})
    err_before = value("composable_dra_plugin_prepare_seconds_count", {"result": "error"})
    un_before = value("composable_dra_plugin_unprepare_seconds_count", {"result": "ok"})
    ref = env.api.add(claim())
    bad = env.api.add(claim(name="bad", allocated=False))
    env.preparer.prepare([ref, bad])
    assert value("composable_dra_plugin_prepared_claims", {}) == 1
    env.preparer.unprepare([ref])
    assert value("composable_dra_plugin_prepare_seconds_count", {"result": "ok"}) == ok_before + 1
    assert (
        value("composable_dra_plugin_prepare_seconds_count", {"result": "error"}) == err_before + 1
    )
    assert value("composable_dra_plugin_unprepare_seconds_count", {"result": "ok"}) == un_before + 1
    assert value("composable_dra_plugin_prepared_claims", {}) == 0


def test_nvidia_visible_devices_names_gpus_as_nvml_does() -> None:
    # Redfish reports a GPU's bare UUID; the NVIDIA runtime matches 'GPU-<uuid>' only.
    bare = "E7F1F5A7-0000-4000-8000-000000000001"
    spec = build_spec("uid-1", [CdiDevice("gpu-0", bare), CdiDevice("gpu-1", "GPU-abc")])
    env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{bare.lower()},GPU-abc"
    assert env["COMPOSABLE_GPU_UUIDS"] == f"{bare},GPU-abc"


def test_held_devices_carry_their_claims_qos_profile_across_a_restart(env: Env) -> None:
    """The QoS attributes keep the headroom of the claims prepared here (issue 18)."""
    profile = {"transfer": 0.2, "tolerance": 0.1, "hostLoad": 0.3}
    with_qos = env.api.add(
        claim(
            name="qos",
            results=[result("gpu-0"), result("gpu-1", request="other")],
            config=[opaque(gpu_config(qos=profile), requests=["gpu"])],
        )
    )
    plain = env.api.add(claim(name="plain", results=[result("gpu-2")]))
    assert env.preparer.held() == []
    env.preparer.prepare([with_qos, plain])
    expected = {
        ("gpu-0", QosProfile(transfer=0.2, tolerance=0.1, host_load=0.3)),
        ("gpu-1", None),  # the other request: no profile
        ("gpu-2", None),
    }
    assert set(env.preparer.held()) == expected
    assert set(env.restart().held()) == expected  # from the checkpoint
    env.preparer.unprepare([with_qos])
    assert env.preparer.held() == [("gpu-2", None)]
    # A profile that cannot describe a job is refused at prepare, with the reason.
    bad = env.api.add(
        claim(
            name="bad",
            results=[result("gpu-0")],
            config=[opaque(gpu_config(qos={"transfer": -1, "tolerance": 0.1}))],
        )
    )
    assert "qos.transfer" in env.preparer.prepare([bad])[bad.uid].error


def test_a_claim_the_scheduler_made_for_an_extended_resource_is_prepared_like_any(
    env: Env,
) -> None:
    """No user-chosen name, the pod as owner, a request named after the container: the
    plugin reads none of these, and prepares and unprepares the claim as any other."""
    made = as_scheduler_claim(claim(results=[result("gpu-1")]))
    ref = env.api.add(made)
    out = env.preparer.prepare([ref])[ref.uid]
    assert out.error == ""
    [dev] = out.devices
    assert (dev.request_names, dev.device_name) == (["container-0-request-0"], "gpu-1")
    (cdi_id,) = dev.cdi_device_ids
    assert resolve(env.cdi_dir, cdi_id) is not None
    assert env.preparer.unprepare([ref])[ref.uid] == ""
    assert list(env.cdi_dir.iterdir()) == []
