"""The attach daemon on a fabric that picks the GPU (composable_operator/picks.py): the
resource names a slot, the FM's pick is recorded and used, and a lost answer is found
again by the host's resource diff. Fakes for the fabric and the API server."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

from api.v1alpha1 import FabricSpec
from composable_dra.fabric.backend import Device, Host, picker
from composable_dra.fabric.errors import TransientError
from composable_dra.fabric.slots import slot_name
from composable_dra.k8s.kube import JSON
from composable_dra.model import names
from composable_operator.attach_daemon import AttachDaemon
from composable_operator.controller import Controller, ControllerSettings
from composable_operator.reconcile import REQUEST_SETTLE_SECONDS, AttachRecord
from tests.unit.composable_operator.test_attach_daemon import Body, Kube, Stopped

SLOT = slot_name("z1", "H100", 0)
FABRIC = FabricSpec.model_validate(
    {
        "backend": "fsas-fm",
        "endpoint": "https://fm.example",
        "fsas": {"tenantUUID": "t", "realm": "r", "attachBy": "model", "models": ["H100"]},
        "credentialsSecret": {"name": "s", "namespace": "ns"},
        "operationTimeoutSeconds": 60,
    }
)


class Cluster(Kube):
    """The fake API server, with other ComposableResources to list."""

    def __init__(self, body: Body, others: list[JSON] | None = None) -> None:
        super().__init__(body)
        self.others = others or []

    def get(self, _path: str, **_: Any) -> JSON:
        return {"items": self.others}


class PickingFM:
    """An FM that attaches the first free GPU of the model; ``drop`` loses the next
    answer after the attach landed."""

    picks_device = True

    def __init__(self, body: Body, free: list[str], attached: dict[str, str] | None = None):
        self.body, self.free = body, free
        self.attached = dict(attached or {})  # device -> host
        self.calls: list[tuple[str, str]] = []
        self.drop = False

    def get(self, _name: str) -> tuple[FabricSpec, PickingFM]:
        return FABRIC, self

    def hosts(self) -> dict[str, Host]:
        return {"h1": Host("h1", "uuid-h1")}

    def _dev(self, i: str) -> Device:
        return Device(i, "H100", "z1", f"GPU-{i}", "attached", host=self.attached[i])

    def device(self, device_id: str) -> Device | None:
        return self._dev(device_id) if device_id in self.attached else None

    def host_devices(self, host: str) -> list[Device]:
        return [self._dev(i) for i, h in sorted(self.attached.items()) if h == host]

    def attach_model(self, model: str, host: str) -> Device:
        self.calls.append((model, host))
        picked = self.free.pop(0)
        self.attached[picked] = host
        visible = {"type": names.DEVICE_VISIBLE, "status": "True"}
        self.body.status["conditions"] = [visible]  # the node's plugin reports it
        if self.drop:
            self.drop = False
            raise TransientError("connection dropped after the change")
        return self._dev(picked)


def run(body: Body, fm: PickingFM, kube: Cluster, limit: int = 6) -> Controller:
    ctl = Controller(kube, fabrics=fm, settings=ControllerSettings(online_poll=10))  # type: ignore[arg-type]
    d = AttachDaemon(ctl, body, Stopped(limit), lambda _k: [], lambda *_: None, "r1")
    asyncio.run(d.run())
    return ctl


def slot_body() -> Body:
    body = Body()
    body.spec = {"fabric": "fab", "deviceID": SLOT, "targetNode": "n1", "model": "H100"}
    return body


def test_the_fms_pick_is_recorded_and_used() -> None:
    body = slot_body()
    fm = PickingFM(body, free=["gpu-7", "gpu-8"])
    assert picker(fm) is fm
    run(body, fm, Cluster(body))
    assert fm.calls == [("H100", "h1")]  # one attach, by model
    assert body.status["fabricDeviceID"] == "gpu-7"
    assert body.status["phase"] == "Online" and body.status["deviceUUID"] == "GPU-gpu-7"
    assert "pendingAttach" not in body.status


def test_a_lost_answer_is_found_again_by_the_hosts_diff_and_not_attached_twice() -> None:
    body = slot_body()
    fm = PickingFM(body, free=["gpu-7", "gpu-8"], attached={"gpu-1": "h1"})
    fm.drop = True
    run(body, fm, Cluster(body))
    assert fm.calls == [("H100", "h1")]
    assert body.status["fabricDeviceID"] == "gpu-7" and body.status["phase"] == "Online"
    assert fm.attached == {"gpu-1": "h1", "gpu-7": "h1"}


def test_after_a_restart_the_record_finds_our_gpu_not_another_resources() -> None:
    body = slot_body()
    # The operator died with the request out: the record lists the host's GPUs before it.
    record = AttachRecord("h1", time.time() - 1, machine_resources=("gpu-1",))
    body.status = {"phase": "Attaching", "pendingAttach": record.to_json()}
    # Since then gpu-5 (another resource's, recorded) and gpu-7 (ours) landed.
    fm = PickingFM(body, free=["gpu-8"], attached={"gpu-1": "h1", "gpu-5": "h1", "gpu-7": "h1"})
    body.status["conditions"] = [{"type": names.DEVICE_VISIBLE, "status": "True"}]
    other = {
        "metadata": {"name": "r0", "uid": "u0"},
        "spec": {"fabric": "fab", "deviceID": slot_name("z1", "H100", 1)},
        "status": {"fabricDeviceID": "gpu-5"},
    }
    run(body, fm, Cluster(body, [other]))
    assert fm.calls == []  # nothing attached again
    assert body.status["fabricDeviceID"] == "gpu-7" and body.status["phase"] == "Online"


def test_a_request_that_never_landed_is_sent_again_once_it_no_longer_can() -> None:
    body = slot_body()
    fm = PickingFM(body, free=["gpu-7"], attached={"gpu-1": "h1"})
    fresh = AttachRecord("h1", time.time() - 1, machine_resources=("gpu-1",))
    body.status = {"phase": "Attaching", "pendingAttach": fresh.to_json()}
    run(body, fm, Cluster(body), limit=2)
    assert fm.calls == []  # it may still land: wait
    old = replace(fresh, requested_at=time.time() - REQUEST_SETTLE_SECONDS - 1)
    body.status = {"phase": "Attaching", "pendingAttach": old.to_json()}
    run(body, fm, Cluster(body))
    assert fm.calls == [("H100", "h1")]
    assert body.status["fabricDeviceID"] == "gpu-7" and body.status["phase"] == "Online"


def test_a_record_of_a_resource_gone_or_going_does_not_hide_our_gpu() -> None:
    """gpu-7 was another resource's, detached and attached again for us (its answer lost):
    neither that resource's stale record (being deleted) nor a pick this process kept for
    a resource that is gone makes the recovery miss it."""
    body = slot_body()
    fm = PickingFM(body, free=["gpu-7", "gpu-8"], attached={"gpu-1": "h1"})
    fm.drop = True
    going = {
        "metadata": {"name": "r0", "uid": "u0", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"fabric": "fab", "deviceID": slot_name("z1", "H100", 1)},
        "status": {"fabricDeviceID": "gpu-7"},
    }
    kube = Cluster(body, [going])
    ctl = Controller(kube, fabrics=fm, settings=ControllerSettings(online_poll=10))  # type: ignore[arg-type]
    ctl.picks.remember("u-gone", "gpu-7")  # a resource since deleted, in this process
    d = AttachDaemon(ctl, body, Stopped(6), lambda _k: [], lambda *_: None, "r1")
    asyncio.run(d.run())
    assert fm.calls == [("H100", "h1")]
    assert body.status["fabricDeviceID"] == "gpu-7" and body.status["phase"] == "Online"
