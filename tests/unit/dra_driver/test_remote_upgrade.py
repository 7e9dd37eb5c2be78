"""A plugin upgrade over a claim prepared by the version before pool keys: its checkpoint
records name a remote device's CDI device and lease directory by claim UID and device
alone (``<claim uid>-<device>``, ``<claim uid>/<device>/``). The running container has
those mounted, so the new plugin keeps using them for that claim until it is unprepared."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dra_driver.cdi import resolve
from dra_driver.lease_refresh import LeaseRefresher
from tests.unit.dra_driver.plugin_fixtures import DRIVER
from tests.unit.dra_driver.test_plugin_remote_prepare import DONOR, Env, env, remote_claim

__all__ = ["env"]  # the fixture

UID = "u-old"
CDI_NAME = f"{UID}-gpu-0-remote"
CONTAINER_DIR = f"/var/run/composable-dra/remote-gpu/{UID}/gpu-0-remote"


def old_checkpoint(state: Path) -> dict[str, Any]:
    """The checkpoint file as the previous plugin wrote it for one remote device."""
    host_dir = str(state / "remote-gpu" / UID / "gpu-0-remote")
    env_vars = {
        "REMOTE_GPUS": "0",
        "REMOTE_GPU_0_ENDPOINT": "10.0.0.4:7470",
        "REMOTE_GPU_0_LEASE": "17",
        "REMOTE_GPU_0_TOKEN_FILE": f"{CONTAINER_DIR}/token",
        "REMOTE_GPU_0_DIR": CONTAINER_DIR,
        "REMOTE_GPU_ENDPOINT": "10.0.0.4:7470",
        "REMOTE_GPU_LEASE": "17",
        "REMOTE_GPU_TOKEN_FILE": f"{CONTAINER_DIR}/token",
        "REMOTE_GPU_DIR": CONTAINER_DIR,
    }
    edits = {
        "env": [f"{k}={v}" for k, v in env_vars.items()],
        "mounts": [
            {"hostPath": host_dir, "containerPath": CONTAINER_DIR, "options": ["ro", "bind"]}
        ],
    }
    record = {
        "uid": UID,
        "namespace": "default",
        "name": "c1",
        "state": "prepared",
        "devices": [
            {
                "request_names": ["gpu"],
                "pool_name": DONOR,
                "device_name": "gpu-0-remote",
                "local_name": "gpu-0-remote",
                "uuid": "",
                "cdi_device_ids": [f"composable.dra.io/gpu={CDI_NAME}"],
                "shareable": False,
                "share_id": None,
                "remote": {"donor": DONOR, "lease": 17, "endpoint": "10.0.0.4:7470"},
                "qos": None,
            }
        ],
        "cdi_spec": {
            "cdiVersion": "0.6.0",
            "kind": "composable.dra.io/gpu",
            "devices": [{"name": CDI_NAME, "containerEdits": edits}],
        },
    }
    data = {"version": 1, "boot_id": "boot-1", "claims": {UID: record}}
    payload = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return {"checksum": hashlib.sha256(payload).hexdigest(), "data": data}


def test_a_claim_prepared_before_pool_keys_is_refreshed_and_unprepared_where_it_lives(
    env: Env,
) -> None:
    state = env.tmp / "state"
    old_dir = state / "remote-gpu" / UID / "gpu-0-remote"
    old_dir.mkdir(parents=True)
    (old_dir / "token").write_text(json.dumps({"lease": 17}))
    (state / "checkpoint.json").write_text(json.dumps(old_checkpoint(state)))
    obj = remote_claim(UID)
    ref = env.add(obj)
    preparer = env.start()  # the upgraded plugin, over the old checkpoint

    # A repeated prepare answers what the kubelet was told before, spec restored.
    (device,) = preparer.prepare([ref])[UID].devices
    assert device.cdi_device_ids == [f"composable.dra.io/gpu={CDI_NAME}"]
    assert resolve(env.cdi_dir, device.cdi_device_ids[0]) is not None
    assert env.donors.fetched == []

    # A re-opened lease goes into the directory the running container has mounted.
    obj["status"]["devices"][0]["data"].update(lease=40, endpoint="10.0.0.5:7000")
    read = lambda ns, name: env.claims[(ns, name)]  # noqa: E731
    assert (
        LeaseRefresher(
            DRIVER, preparer.prepared_claims, read, preparer.refresh_remote
        ).refresh_once()
        == 1
    )
    assert json.loads((old_dir / "token").read_text())["lease"] == 40
    edits = (resolve(env.cdi_dir, device.cdi_device_ids[0]) or {})["containerEdits"]
    got = dict(e.split("=", 1) for e in edits["env"])
    assert (got["REMOTE_GPU_LEASE"], got["REMOTE_GPU_DIR"]) == ("40", CONTAINER_DIR)
    assert edits["mounts"][0]["hostPath"] == str(old_dir)
    assert [p.name for p in (state / "remote-gpu" / UID).iterdir()] == ["gpu-0-remote"]

    assert preparer.unprepare([ref]) == {UID: ""}
    assert env.donors.closed == [(DONOR, 40)]
    assert not (state / "remote-gpu" / UID).exists()
    assert resolve(env.cdi_dir, device.cdi_device_ids[0]) is None
