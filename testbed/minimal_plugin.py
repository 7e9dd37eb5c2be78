"""A minimal DRA kubelet plugin for testing the test bed itself (not the product plugin).

It registers under a driver name, serves the DRA versions it is told to, writes one CDI
spec per claim with the claim's devices, and records every call it gets.
"""

from __future__ import annotations

import json
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from api.dra.v1 import api_pb2 as dra_v1
from api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from api.dra.v1beta1 import api_pb2 as dra_v1beta1
from api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from api.pluginregistration.v1 import api_pb2 as reg
from api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from composable_dra.k8s.kube import Kube, path


@dataclass
class Calls:
    prepared: list[str] = field(default_factory=list)  # claim UIDs
    unprepared: list[str] = field(default_factory=list)
    registration_status: list[tuple[bool, str]] = field(default_factory=list)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: MinimalPlugin) -> None:
        self.plugin = plugin

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin",
            name=self.plugin.driver,
            endpoint=str(self.plugin.service_socket),
            supported_versions=self.plugin.versions,
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        with self.plugin.lock:
            self.plugin.calls.registration_status.append((request.plugin_registered, request.error))
        return reg.RegistrationStatusResponse()


def _dra_servicer(plugin: MinimalPlugin, pb: Any, base: type) -> Any:
    class Servicer(base):  # type: ignore[misc]
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            response = pb.NodePrepareResourcesResponse()
            for claim in request.claims:
                response.claims[claim.uid].CopyFrom(plugin.prepare(pb, claim))
            return response

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            response = pb.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                plugin.unprepare(claim.uid)
                response.claims[claim.uid].CopyFrom(pb.NodeUnprepareResourceResponse())
            return response

    return Servicer()


class MinimalPlugin:
    def __init__(
        self,
        kube: Kube,
        driver: str,
        registry_dir: Path,
        plugins_dir: Path,
        cdi_dir: Path,
        versions: tuple[str, ...] = ("v1.DRAPlugin", "v1beta1.DRAPlugin"),
    ) -> None:
        self.kube = kube
        self.driver = driver
        self.registration_socket = registry_dir / f"{driver}-reg.sock"
        self.service_socket = plugins_dir / driver / "dra.sock"
        self.cdi_dir = cdi_dir
        self.versions = list(versions)
        self.calls = Calls()
        self.lock = threading.Lock()
        self._servers: list[grpc.Server] = []

    def start(self) -> None:
        self.service_socket.parent.mkdir(parents=True, exist_ok=True)
        service = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        if "v1.DRAPlugin" in self.versions:
            dra_v1_grpc.add_DRAPluginServicer_to_server(
                _dra_servicer(self, dra_v1, dra_v1_grpc.DRAPluginServicer), service
            )
        if "v1beta1.DRAPlugin" in self.versions:
            dra_v1beta1_grpc.add_DRAPluginServicer_to_server(
                _dra_servicer(self, dra_v1beta1, dra_v1beta1_grpc.DRAPluginServicer), service
            )
        service.add_insecure_port(f"unix://{self.service_socket}")
        service.start()
        registration = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        registration.add_insecure_port(f"unix://{self.registration_socket}")
        registration.start()
        self._servers = [service, registration]

    def stop(self) -> None:
        for server in self._servers:
            server.stop(grace=None)
        self.registration_socket.unlink(missing_ok=True)
        self.service_socket.unlink(missing_ok=True)

    def prepare(self, pb: Any, claim: Any) -> Any:
        obj = self.kube.get(
            path("resource.k8s.io/v1", "resourceclaims", claim.name, namespace=claim.namespace)
        )
        if obj["metadata"]["uid"] != claim.uid:
            return pb.NodePrepareResourceResponse(error="claim UID mismatch")
        results = [
            r
            for r in obj.get("status", {})
            .get("allocation", {})
            .get("devices", {})
            .get("results", [])
            if r["driver"] == self.driver
        ]
        kind = "example.com/test"
        spec = {
            "cdiVersion": "0.6.0",
            "kind": kind,
            "devices": [
                {
                    "name": f"{claim.uid}-{r['device']}",
                    "containerEdits": {"env": [f"TEST_DEVICE={r['device']}"]},
                }
                for r in results
            ],
        }
        (self.cdi_dir / f"test-{claim.uid}.json").write_text(json.dumps(spec))
        with self.lock:
            self.calls.prepared.append(claim.uid)
        return pb.NodePrepareResourceResponse(
            devices=[
                pb.Device(
                    request_names=[r["request"]],
                    pool_name=r["pool"],
                    device_name=r["device"],
                    cdi_device_ids=[f"{kind}={claim.uid}-{r['device']}"],
                )
                for r in results
            ]
        )

    def unprepare(self, claim_uid: str) -> None:
        (self.cdi_dir / f"test-{claim_uid}.json").unlink(missing_ok=True)
        with self.lock:
            self.calls.unprepared.append(claim_uid)
