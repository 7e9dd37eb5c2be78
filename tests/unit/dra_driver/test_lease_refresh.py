"""A lease the controller re-opened reaches the running container: the plugin finds it in
the claim and replaces the files of the lease's directory (no gRPC, no donor)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from dra_driver.cdi import resolve
from dra_driver.lease_refresh import LeaseRefresher
from dra_driver.prepare import ClaimNotFound
from dra_driver.remote_key import RemoteKey
from dra_driver.remote_prepare import RemotePlanned, stale_leases
from testbed.containers import on_host
from tests.unit.dra_driver.plugin_fixtures import DRIVER
from tests.unit.dra_driver.test_plugin_remote_prepare import (
    DONOR,
    OTHER,
    Env,
    container_env,
    env,
    remote_claim,
    two_donor_claim,
)

__all__ = ["env"]  # the fixture


def reopen(obj: dict[str, Any], lease: int, endpoint: str = "10.0.0.5:7000") -> None:
    """What the lease controller writes when it re-opens the claim's lease."""
    data = obj["status"]["devices"][0]["data"]
    data.update(lease=lease, endpoint=endpoint)


def refreshes(result: str) -> float:
    value = REGISTRY.get_sample_value(
        "composable_dra_plugin_lease_refreshes_total", {"result": result}
    )
    return value or 0.0


def test_stale_leases_are_the_devices_whose_claim_names_another_ready_lease(env: Env) -> None:
    obj = remote_claim("u-1")
    ref = env.add(obj)
    devices = env.preparer.prepare([ref])[ref.uid].devices
    assert stale_leases(devices, obj, DRIVER) == []
    reopen(obj, 40)
    assert stale_leases(devices, obj, DRIVER) == [
        RemotePlanned("gpu", DONOR, "gpu-0-remote", "10.0.0.5:7000", 40)
    ]
    # No ready lease (the donor is down, or the re-open failed): nothing newer to fetch.
    obj["status"]["devices"][0]["conditions"] = [{"type": "RemoteGPUFailed", "status": "True"}]
    assert stale_leases(devices, obj, DRIVER) == []


def test_a_reopened_lease_is_written_into_the_directory_the_container_has(env: Env) -> None:
    obj = remote_claim("u-2")
    ref = env.add(obj)
    (device,) = env.preparer.prepare([ref])[ref.uid].devices
    directory = env.remote.lease_dir(RemoteKey(ref.uid, DONOR, "gpu-0-remote"))
    # What a bind mount of the token file would have kept: the old inode.
    pinned = directory.parent.parent / "pinned"
    os.link(directory / "token", pinned)
    refresher = LeaseRefresher(
        DRIVER,
        env.preparer.prepared_claims,
        lambda ns, name: env.claims[(ns, name)],
        env.preparer.refresh_remote,
    )
    assert refresher.refresh_once() == 0  # nothing re-opened yet
    reopen(obj, 40)
    before = refreshes("ok")
    assert refresher.refresh_once() == 1
    assert refreshes("ok") == before + 1
    # The directory's files are the new lease's; the pinned inode still says the old one.
    assert json.loads((directory / "token").read_text())["lease"] == 40
    assert json.loads((directory / "endpoint").read_text()) == {
        "endpoint": "10.0.0.5:7000",
        "lease": 40,
    }
    assert json.loads(pinned.read_text())["lease"] == 17
    pinned.unlink()
    # Recorded: a container started from now on gets the new env; done once.
    assert refresher.refresh_once() == 0
    edits = (resolve(env.cdi_dir, device.cdi_device_ids[0]) or {})["containerEdits"]
    got = dict(e.split("=", 1) for e in edits["env"])
    assert (got["REMOTE_GPU_LEASE"], got["REMOTE_GPU_ENDPOINT"]) == ("40", "10.0.0.5:7000")
    assert edits["mounts"][0]["hostPath"] == str(directory)
    # Unprepare closes the lease the claim holds now.
    assert env.preparer.unprepare([ref]) == {ref.uid: ""}
    assert env.donors.closed == [(DONOR, 40)]
    assert not directory.exists()


def test_a_donor_refusing_the_new_credentials_is_tried_again(env: Env) -> None:
    obj = remote_claim("u-3")
    ref = env.add(obj)
    env.preparer.prepare([ref])
    refresher = LeaseRefresher(
        DRIVER,
        env.preparer.prepared_claims,
        lambda ns, name: env.claims[(ns, name)],
        env.preparer.refresh_remote,
    )
    reopen(obj, 41)
    env.donors.down = True
    before = refreshes("error")
    assert refresher.refresh_once() == 0
    assert refreshes("error") == before + 1
    token = env.remote.lease_dir(RemoteKey(ref.uid, DONOR, "gpu-0-remote")) / "token"
    assert json.loads(token.read_text())["lease"] == 17  # the old files stay
    env.donors.down = False
    assert refresher.refresh_once() == 1
    assert json.loads(token.read_text())["lease"] == 41


def test_a_deleted_or_replaced_claim_is_left_to_unprepare(env: Env) -> None:
    obj = remote_claim("u-4")
    ref = env.add(obj)
    env.preparer.prepare([ref])
    reopen(obj, 42)

    def gone(ns: str, name: str) -> dict[str, Any]:
        raise ClaimNotFound(name)

    claims = env.preparer.prepared_claims
    assert LeaseRefresher(DRIVER, claims, gone, env.preparer.refresh_remote).refresh_once() == 0
    other = {**obj, "metadata": {**obj["metadata"], "uid": "u-other"}}
    replaced = LeaseRefresher(DRIVER, claims, lambda ns, name: other, env.preparer.refresh_remote)
    assert replaced.refresh_once() == 0
    assert env.donors.fetched == [(DONOR, 17)]


def test_a_reopened_lease_of_one_donor_leaves_the_other_donors_same_named_device(
    env: Env,
) -> None:
    obj = two_donor_claim("u-5")
    ref = env.add(obj)
    devices = env.preparer.prepare([ref])[ref.uid].devices
    refresher = LeaseRefresher(
        DRIVER,
        env.preparer.prepared_claims,
        lambda ns, name: env.claims[(ns, name)],
        env.preparer.refresh_remote,
    )
    obj["status"]["devices"][1]["data"].update(lease=44, endpoint="10.0.0.6:7000")
    assert refresher.refresh_once() == 1
    ids = [i for d in devices for i in d.cdi_device_ids]
    got, mounts = container_env(env, ids)
    by_endpoint = {got[f"REMOTE_GPU_{i}_ENDPOINT"]: i for i in range(2)}
    assert set(by_endpoint) == {"10.0.0.4:7470", "10.0.0.6:7000"}
    for endpoint, lease in (("10.0.0.4:7470", 17), ("10.0.0.6:7000", 44)):
        i = by_endpoint[endpoint]
        assert got[f"REMOTE_GPU_{i}_LEASE"] == str(lease)
        token = json.loads(Path(on_host(got[f"REMOTE_GPU_{i}_TOKEN_FILE"], mounts)).read_text())
        assert token["lease"] == lease
    assert env.donors.fetched == [(DONOR, 17), (OTHER, 30), (OTHER, 44)]
    assert env.preparer.unprepare([ref]) == {ref.uid: ""}
    assert sorted(env.donors.closed) == [(DONOR, 17), (OTHER, 44)]
