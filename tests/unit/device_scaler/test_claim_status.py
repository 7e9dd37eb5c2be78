"""A claim's status.devices as both of the scaler's controllers apply it (claim_status.py)."""

from __future__ import annotations

from composable_dra.k8s.kube import JSON, Kube
from device_scaler.claim_status import apply_devices

ENTRY = {"driver": "gpu.composable.dra.io", "pool": "p", "device": "gpu-0", "conditions": []}


class Recorder(Kube):
    """Keeps each apply (path, body, manager); sends nothing."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, JSON, str]] = []

    def apply(self, url_path: str, body: JSON, field_manager: str, force: bool = True) -> JSON:
        self.applied.append((url_path, body, field_manager))
        return body


def test_a_claims_devices_are_applied_to_its_status_under_the_callers_manager() -> None:
    kube = Recorder()
    key = {"namespace": "team-a", "name": "train", "uid": "u-1"}
    apply_devices(kube, (ENTRY,), "composable-dra-lease-controller", **key)
    [(url, body, manager)] = kube.applied
    assert url == "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train/status"
    assert body == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "team-a", "uid": "u-1"},
        "status": {"devices": [ENTRY]},
    }
    assert manager == "composable-dra-lease-controller"
