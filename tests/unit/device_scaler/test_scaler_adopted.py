"""Adopted orphans follow the scaler's idle rule: the resource the operator
creates for an orphan is detached once idle, like any GPU the scaler attached."""

from __future__ import annotations

from typing import Any

from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import format_time
from composable_dra.model.names import ANN_ADOPTED, ANN_IN_USE_BY
from composable_operator.fabric_status import ADOPTED, FabricWatch, Orphan
from device_scaler.decide import (
    DeleteResource,
    PatchResource,
    ScalerSettings,
    ScalerSnapshot,
    decide,
    managed,
)

NOW = 1_800_000_000.0
CFG = ScalerSettings(attach_timeout=60, no_removal=100, quarantine=30)


class RecordingKube:
    def __init__(self) -> None:
        self.created: list[JSON] = []
        self.deleted: list[str] = []

    def create(self, _path: str, body: JSON) -> JSON:
        self.created.append(body)
        return body

    def delete(self, path: str) -> None:
        self.deleted.append(path)


def adopted(detach: bool = False, attached_at: float = NOW - 500) -> JSON:
    """The resource exactly as the operator creates it for an orphan, once Online."""
    kube = RecordingKube()
    watch = FabricWatch(kube, None)  # type: ignore[arg-type]
    watch.adopt("fab", Orphan("gpu-7", "host-2", "node-b", "H100"), detach)
    [body] = kube.created
    body["metadata"]["creationTimestamp"] = format_time(attached_at)
    body["status"] = {
        "phase": "Online",
        "deviceUUID": "U-7",
        "attachedAt": format_time(attached_at),
    }
    return body


def snap(resources: list[JSON], claims: list[JSON] | None = None, **kw: Any) -> ScalerSnapshot:
    return ScalerSnapshot(
        now=NOW,
        claims=claims or [],
        resources=resources,
        pool_devices={},
        local_devices=kw.get("local", {}),
        requests=kw.get("requests", []),
        quarantines=[],
    )


def test_the_scaler_and_the_operator_name_the_annotation_alike() -> None:
    assert ANN_ADOPTED == ADOPTED


def test_an_adopted_orphan_is_the_scalers_to_detach_when_idle() -> None:
    cr = adopted()
    assert managed(cr)
    [d] = decide(snap([cr]), CFG)
    assert isinstance(d, DeleteResource)
    assert (d.name, d.reason) == (cr["metadata"]["name"], "IdleTimeout")


def test_an_adopted_orphan_within_the_idle_window_stays() -> None:
    assert decide(snap([adopted(attached_at=NOW - 10)]), CFG) == []


def test_an_adopted_orphan_in_use_as_a_local_device_stays_and_is_marked() -> None:
    cr = adopted()
    user = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "c9"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": CFG.driver,
                            "pool": "node-b",
                            "device": "gpu-u-7",
                        }
                    ]
                }
            }
        },
    }
    [p] = decide(snap([cr], [user], local={("node-b", "u-7"): "gpu-u-7"}), CFG)
    assert isinstance(p, PatchResource)
    assert p.patch["metadata"]["annotations"] == {ANN_IN_USE_BY: "c9"}


def test_a_request_minimum_keeps_an_adopted_orphan() -> None:
    req = {"spec": {"fabric": "fab", "model": "H100", "targetNode": "node-b", "minSize": 1}}
    assert decide(snap([adopted()], requests=[req]), CFG) == []


def test_resources_of_a_composability_request_stay_out_of_the_idle_rule() -> None:
    cr = adopted()
    cr["metadata"]["annotations"] = {}
    cr["metadata"]["labels"] = {"composable.dra.io/request": "r1"}
    assert not managed(cr)
    assert decide(snap([cr]), CFG) == []
