"""The plugin's gRPC endpoints: kubelet registration, DRA v1 and v1beta1, and health.

Two unix sockets, as the kubelet expects: ``<plugins_registry_dir>/<driver>-reg.sock``
(Registration) and ``<plugins_dir>/<driver>/dra.sock`` (DRAPlugin v1 and v1beta1, plus
grpc.health.v1). Stale socket files are replaced on start and both are removed on stop.
The probes' health on TCP says SERVING only once the kubelet has registered the plugin:
a rolling update then removes the old instance only after the kubelet can call the new.

For a rolling update both names carry the plugin pod's UID, as the upstream helper's
``RollingUpdate`` option names them (``<driver>-<uid>-reg.sock``, ``dra-<uid>.sock``): the
old and the new instance listen side by side, the kubelet registers both and calls the
newest connected one, and each instance removes only its own sockets when it stops.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from api.dra.v1 import api_pb2 as v1
from api.dra.v1 import api_pb2_grpc as v1_grpc
from api.dra.v1beta1 import api_pb2 as v1beta1
from api.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from api.pluginregistration.v1 import api_pb2 as reg
from api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from api.v1alpha1 import ClaimRef
from composable_dra.process import logs
from dra_driver import claimref, health_stream
from dra_driver.health_stream import HealthFeed
from dra_driver.prepare import Preparer, PrepareResult

SUPPORTED_VERSIONS = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
PLUGIN_TYPE = "DRAPlugin"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


# A pod UID as the API server generates it; anything else would reach a file name.
_UID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class InvalidUID(ValueError):
    pass


def check_uid(uid: str) -> str:
    """``uid`` if it is a pod UID (or empty: no rolling update), else InvalidUID."""
    if uid and not _UID.fullmatch(uid):
        raise InvalidUID(f"rolling update UID {uid!r} is not a pod UID")
    return uid


def _uid_part(uid: str) -> str:
    return f"-{check_uid(uid)}" if uid else ""


def registration_socket(plugins_registry_dir: Path, driver: str, uid: str = "") -> Path:
    return plugins_registry_dir / f"{driver}{_uid_part(uid)}-reg.sock"


def service_socket(plugins_dir: Path, driver: str, uid: str = "") -> Path:
    return plugins_dir / driver / f"dra{_uid_part(uid)}.sock"


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(
        self,
        driver: str,
        endpoint: Path,
        services: Sequence[str] = (),
        probe: health.HealthServicer | None = None,
    ) -> None:
        self.driver, self.endpoint, self._probe = driver, endpoint, probe
        # The kubelet opens the health stream only for a service listed here.
        self.versions = [*SUPPORTED_VERSIONS, *services]
        self.registered: bool | None = None
        self._log = logs.get(__name__)

    def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=self.versions,
        )

    def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        if self._probe is not None:
            self._probe.set("", _SERVING if request.plugin_registered else _NOT_SERVING)
        if request.plugin_registered:
            self._log.info("registered with the kubelet", driver=self.driver)
        else:
            self._log.error(
                "kubelet refused the registration", driver=self.driver, error=request.error
            )
        return reg.RegistrationStatusResponse()


def _refs(claims: Any) -> tuple[list[ClaimRef], dict[str, str]]:
    """The well-formed claim references, and an error for each other one by its UID.

    A malformed reference is answered in its own entry and goes no further: no API
    call, no file.
    """
    refs: list[ClaimRef] = []
    refused: dict[str, str] = {}
    for c in claims:
        why = claimref.problem(c.namespace, c.name, c.uid)
        if why is None:
            refs.append(ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid))
        else:
            refused[c.uid] = why
    if refused:
        logs.get(__name__).warning("claim references refused", errors=list(refused.values()))
    return refs, refused


def _prepare(preparer: Preparer, claims: Any) -> dict[str, PrepareResult]:
    refs, refused = _refs(claims)
    results = preparer.prepare(refs)
    return {**results, **{uid: PrepareResult(error=why) for uid, why in refused.items()}}


def _unprepare(preparer: Preparer, claims: Any) -> dict[str, str]:
    refs, refused = _refs(claims)
    return {**preparer.unprepare(refs), **refused}


class DRAServicer(v1_grpc.DRAPluginServicer, v1beta1_grpc.DRAPluginServicer):
    """The DRAPlugin service in one API version's messages (``api``: the ``api_pb2``
    module of v1 or v1beta1); a Device's ``share_id`` where the version has one."""

    def __init__(self, preparer: Preparer, api: ModuleType) -> None:
        self._preparer = preparer
        self._api = api
        self._share_ids = "share_id" in api.Device.DESCRIPTOR.fields_by_name

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        resp = self._api.NodePrepareResourcesResponse()
        for uid, result in _prepare(self._preparer, request.claims).items():
            entry = resp.claims[uid]
            if result.error:
                entry.error = result.error
                continue
            for dev in result.devices:
                out = entry.devices.add(
                    request_names=dev.request_names,
                    pool_name=dev.pool_name,
                    device_name=dev.device_name,
                    cdi_device_ids=dev.cdi_device_ids,
                )
                if dev.share_id and self._share_ids:
                    out.share_id = dev.share_id
        return resp

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        resp = self._api.NodeUnprepareResourcesResponse()
        for uid, error in _unprepare(self._preparer, request.claims).items():
            resp.claims[uid].error = error
        return resp


# gRPC refuses a longer unix socket path (sun_path is 108 bytes, with its own overhead).
MAX_SOCKET_PATH = 105


def _bind_unix(server: grpc.Server, path: Path) -> None:
    if len(str(path)) > MAX_SOCKET_PATH:
        raise OSError(
            f"socket path {path} has {len(str(path))} characters, gRPC binds at most"
            f" {MAX_SOCKET_PATH}: use shorter kubelet directories"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    # A socket file left by a killed plugin would make the bind fail: replace it.
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if server.add_insecure_port(f"unix://{path}") == 0:
        raise OSError(f"cannot listen on {path}")


# Threads that answer the kubelet's DRA and health calls on the service socket.
_SERVICE_WORKERS = 8


class PluginServer:
    """Both gRPC servers of the plugin; start() binds, stop() unbinds and removes sockets."""

    def __init__(
        self,
        preparer: Preparer,
        driver: str,
        plugins_registry_dir: Path,
        plugins_dir: Path,
        *,
        health_port: int = 0,
        rolling_update_uid: str = "",
        health_feed: HealthFeed | None = None,
        health_resend: float = health_stream.RESEND,
    ) -> None:
        self.registration_path = registration_socket(
            plugins_registry_dir, driver, rolling_update_uid
        )
        self.service_path = service_socket(plugins_dir, driver, rolling_update_uid)
        services = health_stream.SERVICES if health_feed is not None else []
        self.health = health.HealthServicer()
        # What the kubelet's probes read (on TCP): not serving until registered.
        self.probe = health.HealthServicer()
        self.probe.set("", _NOT_SERVING)
        self.registration = RegistrationServicer(driver, self.service_path, services, self.probe)
        self._feed = health_feed
        self._service = grpc.server(futures.ThreadPoolExecutor(max_workers=_SERVICE_WORKERS))
        v1_grpc.add_DRAPluginServicer_to_server(DRAServicer(preparer, v1), self._service)
        v1beta1_grpc.add_DRAPluginServicer_to_server(DRAServicer(preparer, v1beta1), self._service)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._service)
        if health_feed is not None:
            health_stream.add_to_server(health_feed, self._service, health_resend)
        self._registrar = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(self.registration, self._registrar)
        # The liveness probe may use TCP; that server carries health only, never DRA.
        self._health_server: grpc.Server | None = None
        self._health_port = health_port
        self.bound_health_port = 0
        self._log = logs.get(__name__)

    def start(self) -> None:
        _bind_unix(self._service, self.service_path)
        self._service.start()
        if self._health_port:
            self._health_server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
            health_pb2_grpc.add_HealthServicer_to_server(self.probe, self._health_server)
            self.bound_health_port = self._health_server.add_insecure_port(
                f"0.0.0.0:{self._health_port}"
            )
            self._health_server.start()
        for name in ("", "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"):
            self.health.set(name, _SERVING)
        # Register last: the kubelet connects to the service as soon as it sees us.
        _bind_unix(self._registrar, self.registration_path)
        self._registrar.start()
        self._log.info(
            "serving",
            registration=str(self.registration_path),
            service=str(self.service_path),
        )

    def stop(self, grace: float = 2.0) -> None:
        self.health.enter_graceful_shutdown()
        self.probe.enter_graceful_shutdown()
        if self._feed is not None:
            self._feed.stop()  # the kubelet's stream ends now, not at its next resend
        self._registrar.stop(grace).wait()
        self._service.stop(grace).wait()
        if self._health_server is not None:
            self._health_server.stop(grace).wait()
        for path in (self.registration_path, self.service_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
