"""The kubelet protocols in api/ match the published contract, and their stubs are current."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from api.dra.v1 import api_pb2 as dra_v1
from api.dra.v1beta1 import api_pb2 as dra_v1beta1
from api.dra_health.v1 import api_pb2 as health_v1
from api.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from api.pluginregistration.v1 import api_pb2 as registration

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api_pb2_grpc.pyi")
PROTO_DIRS = (
    "api/dra/v1",
    "api/dra/v1beta1",
    "api/pluginregistration/v1",
    "api/dra_health/v1",
    "api/dra_health/v1alpha1",
)


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    subprocess.run(
        ["bash", str(ROOT / "hack/gen-protos.sh"), str(tmp_path)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    stale = [
        f"{d}/{name}"
        for d in PROTO_DIRS
        for name in GENERATED
        if not filecmp.cmp(ROOT / d / name, tmp_path / d / name, shallow=False)
    ]
    assert not stale, f"stale generated stubs, run `make protos`: {stale}"


# (message, field) -> number, as published in k8s.io/kubelet.
DRA_FIELDS = {
    ("NodePrepareResourcesRequest", "claims"): 1,
    ("NodePrepareResourcesResponse", "claims"): 1,
    ("NodePrepareResourceResponse", "devices"): 1,
    ("NodePrepareResourceResponse", "error"): 2,
    ("Device", "request_names"): 1,
    ("Device", "pool_name"): 2,
    ("Device", "device_name"): 3,
    ("Device", "cdi_device_ids"): 4,
    ("NodeUnprepareResourcesRequest", "claims"): 1,
    ("NodeUnprepareResourcesResponse", "claims"): 1,
    ("NodeUnprepareResourceResponse", "error"): 1,
    ("Claim", "namespace"): 1,
    ("Claim", "uid"): 2,
    ("Claim", "name"): 3,
}


@pytest.mark.parametrize(
    ("module", "package"),
    [
        (dra_v1, "k8s.io.kubelet.pkg.apis.dra.v1"),
        (dra_v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1"),
    ],
)
def test_dra_contract(module: object, package: str) -> None:
    desc = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert desc.package == package
    service = desc.services_by_name["DRAPlugin"]
    assert service.full_name == f"{package}.DRAPlugin"
    assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    for (message, field), number in DRA_FIELDS.items():
        assert desc.message_types_by_name[message].fields_by_name[field].number == number


def test_v1_device_has_share_id() -> None:
    field = dra_v1.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"]
    assert field.number == 5
    assert field.has_presence
    assert "share_id" not in dra_v1beta1.DESCRIPTOR.message_types_by_name["Device"].fields_by_name


def numbers(desc: Any, message: str) -> dict[str, int]:
    """A message's fields by name, with their numbers."""
    return {n: f.number for n, f in desc.message_types_by_name[message].fields_by_name.items()}


def test_registration_contract() -> None:
    desc = registration.DESCRIPTOR
    assert desc.package == "pluginregistration"
    service = desc.services_by_name["Registration"]
    assert service.full_name == "pluginregistration.Registration"
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert numbers(desc, "PluginInfo") == {
        "type": 1,
        "name": 2,
        "endpoint": 3,
        "supported_versions": 4,
    }
    assert numbers(desc, "RegistrationStatus") == {"plugin_registered": 1, "error": 2}


@pytest.mark.parametrize(("module", "package"), [(health_v1, "v1"), (health_v1alpha1, "v1alpha1")])
def test_dra_health_contract(module: object, package: str) -> None:
    """The kubelet calls /<package>.DRAResourceHealth/NodeWatchResources (dra-health)."""
    desc = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert desc.package == package
    service = desc.services_by_name["DRAResourceHealth"]
    assert service.full_name == f"{package}.DRAResourceHealth"
    (method,) = service.methods
    assert (method.name, method.server_streaming) == ("NodeWatchResources", True)
    assert numbers(desc, "DeviceHealth") == {
        "device": 1,
        "health": 2,
        "last_updated_time": 3,
        "health_check_timeout_seconds": 4,
        "message": 5,
    }
    assert numbers(desc, "DeviceIdentifier") == {"pool_name": 1, "device_name": 2}
    assert numbers(desc, "NodeWatchResourcesResponse") == {"devices": 1}
    values = desc.enum_types_by_name["HealthStatus"].values_by_name
    assert {n: v.number for n, v in values.items()} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
