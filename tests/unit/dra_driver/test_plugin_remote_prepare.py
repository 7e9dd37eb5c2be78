"""Prepare and unprepare of a remote GPU on the consumer node (no gRPC, no donor)."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, cast

import pytest

from api.v1alpha1 import ClaimRef
from composable_dra.lending.remote_leases import Code, LeaseAPIError, LeaseClient
from dra_driver.cdi import CdiWriter, resolve
from dra_driver.checkpoint import Checkpoint
from dra_driver.claimref import InvalidClaimRef
from dra_driver.prepare import Preparer
from dra_driver.remote_key import RemoteKey
from dra_driver.remote_prepare import RemoteLeases, container_lease_dir, plan_remote
from testbed.containers import on_host
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, claim, gpu

DONOR = "node-d"


class FakeDonors:
    def __init__(self) -> None:
        self.closed: list[tuple[str, int]] = []
        self.fetched: list[tuple[str, int]] = []
        self.down = False

    def credentials(self, donor: str, lease: int) -> dict[str, Any]:
        if self.down:
            raise LeaseAPIError(Code.UNAVAILABLE, "donor down")
        self.fetched.append((donor, lease))
        return {"lease": lease, "donor": "donor-d", "expiry": 1e12, "mac": "ab" * 32}

    def close(self, donor: str, lease: int) -> None:
        if self.down:
            raise LeaseAPIError(Code.UNAVAILABLE, "donor down")
        self.closed.append((donor, lease))


def remote_claim(
    uid: str, lease: int | None = 17, node: str = NODE, gpus: int = 1
) -> dict[str, Any]:
    """A claim allocated ``gpus`` of the donor's remote devices (leases 17, 18, ...)."""
    devices = [f"gpu-{i}-remote" for i in range(gpus)]
    obj = claim(
        uid=uid,
        results=[{"request": "gpu", "driver": DRIVER, "pool": DONOR, "device": d} for d in devices],
    )
    obj["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    if lease is not None:
        obj["status"]["devices"] = [
            {
                "driver": DRIVER,
                "pool": DONOR,
                "device": d,
                "conditions": [{"type": "RemoteGPUReady", "status": "True"}],
                "data": {"donor": DONOR, "endpoint": f"10.0.0.4:{7470 + i}", "lease": lease + i},
            }
            for i, d in enumerate(devices)
        ]
    return obj


class Env:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.donors = FakeDonors()
        self.remote = RemoteLeases(cast(LeaseClient, self.donors), tmp / "state" / "remote-gpu")
        self.cdi_dir = tmp / "cdi"
        self.preparer = self.start()

    def start(self) -> Preparer:
        return Preparer(
            DRIVER,
            NODE,
            lambda ns, name: self.claims[(ns, name)],
            lambda: [gpu(0)],
            Checkpoint(self.tmp / "state" / "checkpoint.json", "boot-1"),
            CdiWriter(self.cdi_dir),
            remote=self.remote,
        )

    def add(self, obj: dict[str, Any]) -> ClaimRef:
        m = obj["metadata"]
        self.claims[(m["namespace"], m["name"])] = obj
        return ClaimRef(m["namespace"], m["name"], m["uid"])


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


def test_prepare_writes_the_lease_directory_and_the_env_from_env_reads(env: Env) -> None:
    ref = env.add(remote_claim("u-1"))
    out = env.preparer.prepare([ref])[ref.uid]
    assert not out.error, out.error
    (device,) = out.devices
    assert device.remote is not None and device.remote.lease == 17
    edits = (resolve(env.cdi_dir, device.cdi_device_ids[0]) or {})["containerEdits"]
    env_vars = dict(e.split("=", 1) for e in edits["env"])
    assert env_vars["REMOTE_GPU_ENDPOINT"] == "10.0.0.4:7470"
    assert env_vars["REMOTE_GPU_LEASE"] == "17"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_vars  # no local GPU
    # The directory is mounted, not the token file: files replaced in it reach the
    # container. The token file variable points into it.
    (mount,) = edits["mounts"]
    assert mount["containerPath"] == env_vars["REMOTE_GPU_DIR"]
    assert mount["containerPath"] == f"/var/run/composable-dra/remote-gpu/u-1/{DONOR}/gpu-0-remote"
    assert env_vars["REMOTE_GPU_TOKEN_FILE"] == mount["containerPath"] + "/token"
    directory = Path(mount["hostPath"])
    assert directory == env.tmp / "state" / "remote-gpu" / "u-1" / DONOR / "gpu-0-remote"
    host = directory / "token"
    assert stat.S_IMODE(host.stat().st_mode) == 0o444  # the container's user, whoever it is
    token_dir = env.tmp / "state" / "remote-gpu"
    assert stat.S_IMODE(token_dir.stat().st_mode) == 0o700  # the host's users: kept out
    for below in (token_dir / "u-1", token_dir / "u-1" / DONOR, directory):
        assert stat.S_IMODE(below.stat().st_mode) == 0o755, below
    assert json.loads(host.read_text())["lease"] == 17
    assert json.loads((directory / "endpoint").read_text()) == {
        "endpoint": "10.0.0.4:7470",
        "lease": 17,
    }
    # Idempotent, also after a restart: the same answer, no second fetch.
    assert env.start().prepare([ref])[ref.uid].devices == out.devices
    assert env.donors.fetched == [(DONOR, 17)]

    assert env.preparer.unprepare([ref]) == {ref.uid: ""}
    assert not host.exists() and not directory.parent.parent.exists()
    assert resolve(env.cdi_dir, device.cdi_device_ids[0]) is None
    assert env.donors.closed == [(DONOR, 17)]


def container_env(env: Env, ids: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The env and mounts (container path -> host path) the CDI devices ``ids`` give."""
    out: dict[str, str] = {}
    mounts: dict[str, str] = {}
    for device_id in ids:
        edits = (resolve(env.cdi_dir, device_id) or {})["containerEdits"]
        for k, v in (e.split("=", 1) for e in edits["env"]):
            assert out.setdefault(k, v) == v, f"{k} conflicts between the claim's devices"
        mounts |= {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    return out, mounts


def test_several_remote_devices_each_get_an_index_and_their_own_token(env: Env) -> None:
    ref = env.add(remote_claim("u-4", gpus=3))
    out = env.preparer.prepare([ref])[ref.uid]
    assert not out.error, out.error
    ids = [i for d in out.devices for i in d.cdi_device_ids]
    got, mounts = container_env(env, ids)
    assert got["REMOTE_GPUS"] == "0,1,2"
    for i in range(3):
        assert got[f"REMOTE_GPU_{i}_ENDPOINT"] == f"10.0.0.4:{7470 + i}"
        assert got[f"REMOTE_GPU_{i}_LEASE"] == str(17 + i)
        token = json.loads(Path(on_host(got[f"REMOTE_GPU_{i}_TOKEN_FILE"], mounts)).read_text())
        assert token["lease"] == 17 + i
        assert got[f"REMOTE_GPU_{i}_DIR"] in mounts
    # The first device keeps the names RemoteGPU.from_env() reads.
    assert got["REMOTE_GPU_LEASE"] == "17"
    assert got["REMOTE_GPU_TOKEN_FILE"] == got["REMOTE_GPU_0_TOKEN_FILE"]
    assert sorted(env.donors.fetched) == [(DONOR, 17), (DONOR, 18), (DONOR, 19)]
    assert env.preparer.unprepare([ref]) == {ref.uid: ""}
    assert sorted(env.donors.closed) == sorted(env.donors.fetched)
    assert not any(Path(h).exists() for h in mounts.values())


def test_no_ready_lease_or_another_node_is_a_claim_error(env: Env) -> None:
    ref = env.add(remote_claim("u-2", lease=None))
    assert "no ready lease" in env.preparer.prepare([ref])[ref.uid].error
    ref = env.add(remote_claim("u-3", node="node-x"))
    assert "another node" in env.preparer.prepare([ref])[ref.uid].error


def test_a_donor_refusing_credentials_fails_the_claim_and_unprepare_still_cleans(
    env: Env,
) -> None:
    env.donors.down = True
    ref = env.add(remote_claim("u-4"))
    assert "refused" in env.preparer.prepare([ref])[ref.uid].error
    assert not list(env.cdi_dir.glob("*.json"))
    # The donor stays down: unprepare succeeds; the controller closes the lease later.
    assert env.preparer.unprepare([ref]) == {ref.uid: ""}


def test_a_plugin_without_lease_settings_refuses_remote_devices(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.remote = None  # type: ignore[assignment]
    preparer = env.start()
    ref = env.add(remote_claim("u-5"))
    assert "--lease-token-file" in preparer.prepare([ref])[ref.uid].error


def test_lease_paths_come_from_checked_names(tmp_path: Path) -> None:
    remote = RemoteLeases(cast(LeaseClient, FakeDonors()), tmp_path)
    key = RemoteKey("u-1", "node-d.z", "gpu-0-remote")
    assert remote.lease_dir(key) == tmp_path / "u-1" / "node-d.z" / "gpu-0-remote"
    assert remote.token_path(key) == tmp_path / "u-1" / "node-d.z" / "gpu-0-remote" / "token"
    assert container_lease_dir(key).endswith("/u-1/node-d.z/gpu-0-remote")
    legacy = RemoteKey("u-1", None, "gpu-0-remote")
    assert remote.lease_dir(legacy) == tmp_path / "u-1" / "gpu-0-remote"
    bad = [("../x", "n", "gpu-0-remote"), ("u", "n", "../../etc"), ("u", "n", "A/B")]
    bad += [("u", "n", ""), ("u/v", "n", "g"), ("u", "..", "g"), ("u", "a/b", "g")]
    bad += [("u", "", "g"), ("u", "A", "g"), ("u", "a_b", "g"), ("u", "x" * 254, "g")]
    for uid, pool, device in bad:
        with pytest.raises(InvalidClaimRef):
            remote.lease_dir(RemoteKey(uid, pool, device))
        with pytest.raises(InvalidClaimRef):
            container_lease_dir(RemoteKey(uid, pool, device))
        with pytest.raises(InvalidClaimRef):
            RemoteKey(uid, pool, device).cdi_name()


def test_plan_remote_skips_local_and_fabric_devices() -> None:
    obj = remote_claim("u-6")
    obj["status"]["allocation"]["devices"]["results"] += [
        {"request": "l", "driver": DRIVER, "pool": NODE, "device": "gpu-0"},
        {"request": "f", "driver": DRIVER, "pool": "fab/zone", "device": "gpu-9-remote"},
    ]
    (planned,) = plan_remote(obj, DRIVER, NODE)
    assert (planned.donor, planned.device, planned.lease) == (DONOR, "gpu-0-remote", 17)


def two_donor_claim(uid: str) -> dict[str, Any]:
    """A claim holding ``gpu-0-remote`` of two donors: the name every donor lends."""
    obj = remote_claim(uid)
    (result,) = obj["status"]["allocation"]["devices"]["results"]
    (status,) = obj["status"]["devices"]
    obj["status"]["allocation"]["devices"]["results"].append({**result, "pool": OTHER})
    data = {"donor": OTHER, "endpoint": "10.0.0.5:7470", "lease": 30}
    obj["status"]["devices"].append({**status, "pool": OTHER, "data": data})
    return obj


OTHER = "node-e.zone-1"  # a node name may hold dots


def test_two_donors_same_device_name_get_their_own_cdi_device_directory_and_index(
    env: Env,
) -> None:
    ref = env.add(two_donor_claim("u-7"))
    out = env.preparer.prepare([ref])[ref.uid]
    assert not out.error, out.error
    ids = [i for d in out.devices for i in d.cdi_device_ids]
    assert len(set(ids)) == 2, ids
    got, mounts = container_env(env, ids)
    assert got["REMOTE_GPUS"] == "0,1"
    assert {got["REMOTE_GPU_0_ENDPOINT"], got["REMOTE_GPU_1_ENDPOINT"]} == {
        "10.0.0.4:7470",
        "10.0.0.5:7470",
    }
    assert len(set(mounts.values())) == 2 and len(mounts) == 2
    for i in range(2):
        token = json.loads(Path(on_host(got[f"REMOTE_GPU_{i}_TOKEN_FILE"], mounts)).read_text())
        assert token["lease"] == int(got[f"REMOTE_GPU_{i}_LEASE"])
    base = env.tmp / "state" / "remote-gpu" / "u-7"
    assert sorted(mounts.values()) == sorted(
        str(base / pool / "gpu-0-remote") for pool in (DONOR, OTHER)
    )
    assert sorted(mounts) == sorted(
        f"/var/run/composable-dra/remote-gpu/u-7/{pool}/gpu-0-remote" for pool in (DONOR, OTHER)
    )
    assert env.preparer.unprepare([ref]) == {ref.uid: ""}
    assert sorted(env.donors.closed) == [(DONOR, 17), (OTHER, 30)]
    assert not base.exists()
    assert not any(resolve(env.cdi_dir, i) for i in ids)
