"""The `redfish-composition` backend: standard Redfish composition with the DMTF client.

Devices are GPU ResourceBlocks; hosts are expandable ComputerSystems; attach and detach
are the ComputerSystem.AddResourceBlock / RemoveResourceBlock actions. Zones say which
hosts a block can reach: a zone lists GPU blocks and the ComputerSystem-type blocks of
the hosts it serves.

Choices that differ from the library's defaults, on purpose:
- TLS is verified: the DMTF client skips verification unless given a CA file, so we
  always pass one (the Fabric's CA, else the certifi bundle) unless told not to.
- No library-level retries of changes: a POST retried blindly after a lost response
  could attach twice. The operator retries at reconcile level, after re-reading state.
- A 401 on a request (expired session) logs in again and repeats that request once;
  the request was refused, so repeating it cannot apply a change twice.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import redfish
from redfish.rest.v1 import RetriesExhaustedError
from requests.adapters import HTTPAdapter

from api.v1alpha1 import DEVICE_ID
from composable_dra.fabric import members
from composable_dra.fabric.backend import (
    Device,
    DeviceState,
    Host,
    Inventory,
    Operation,
    OperationStatus,
    Zone,
)
from composable_dra.fabric.connection import DEFAULT, Connection
from composable_dra.fabric.errors import (
    AuthError,
    BusyError,
    FabricError,
    InsufficientError,
    InUseError,
    NotFoundError,
    OperationFailedError,
    TransientError,
)
from composable_dra.fabric.health import redfish_fault
from composable_dra.fabric.http_errors import Codes, answer_error
from composable_dra.fabric.relogin import once_more_after_401
from composable_dra.fabric.retry_after import poll_hint

ROOT = "/redfish/v1"
BLOCKS = f"{ROOT}/CompositionService/ResourceBlocks"
_DEVICE_ID = re.compile(DEVICE_ID)


def block_uri(device_id: str) -> str:
    """The ResourceBlock URI of a device; FabricError for an id that is not one segment.

    The CRD's pattern refuses such ids already; this is the second line, where the URL
    is built, so that no id can name another resource (``../Systems/x``) or add a query.
    """
    if not _DEVICE_ID.fullmatch(device_id):  # fullmatch: '$' alone lets a final '\n' by
        raise FabricError(f"invalid device id {device_id!r}: not a Redfish resource Id")
    return f"{BLOCKS}/{urllib.parse.quote(device_id, safe=':')}"


T = TypeVar("T")
# The DMTF client logs every request at info level (and headers at debug): keep it quiet.
logging.getLogger("redfish").setLevel(logging.WARNING)
_STATE: dict[str, DeviceState] = {"Unused": "free", "Composed": "attached"}
# MessageId suffix -> error type, for 4xx answers whose status code alone is ambiguous.
_MESSAGE_ERRORS: Codes = {
    "ResourceBlockInUse": InUseError,
    "ResourceInUse": InUseError,
    "ResourceNotFound": NotFoundError,
    "ResourceBlockNotFound": NotFoundError,
    "InsufficientResources": InsufficientError,
    "ResourceExhaustion": InsufficientError,
    "NoValidAllocation": InsufficientError,
    "ServiceTemporarilyUnavailable": BusyError,
}


def _messages(body: Any) -> list[dict[str, Any]]:
    if not isinstance(body, dict):
        return []
    err = body.get("error", {})
    infos = err.get("@Message.ExtendedInfo") if isinstance(err, dict) else None
    infos = infos or body.get("@Message.ExtendedInfo") or body.get("Messages") or []
    return [m for m in infos if isinstance(m, dict)]


def _describe(body: Any, fallback: str) -> str:
    texts = [m.get("Message") or m.get("MessageId", "") for m in _messages(body)]
    if not texts and isinstance(body, dict):
        err = body.get("error", {})
        if isinstance(err, dict) and err.get("message"):
            texts = [str(err["message"])]
    return "; ".join(t for t in texts if t) or fallback


def error_for(status: int, body: Any, headers: dict[str, str], what: str) -> FabricError:
    """The typed error for a failed Redfish response."""
    ids = (str(info.get("MessageId", "")).rsplit(".", 1)[-1] for info in _messages(body))
    return answer_error(status, headers, what, _describe(body, "no details"), ids, _MESSAGE_ERRORS)


def _id(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


class _SingleFlight(Generic[T]):
    """Fresh reads shared by concurrent callers.

    A caller gets a read that started after it asked: it waits for the read in progress
    (which began too early for it) to end, then shares the next one with everyone else
    who asked meanwhile, so it still sees every change that completed before its call.
    """

    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read
        self._cond = threading.Condition()
        self._running = False
        self._last: tuple[float, T] | None = None

    def get(self) -> T:
        asked = time.monotonic()
        with self._cond:
            while True:
                if self._last is not None and self._last[0] >= asked:
                    return self._last[1]
                if not self._running:
                    break
                self._cond.wait()
            self._running = True
        started = time.monotonic()
        try:
            value = self._read()
        except BaseException:
            with self._cond:
                self._running = False
                self._cond.notify_all()
            raise
        with self._cond:
            self._last = (started, value)
            self._running = False
            self._cond.notify_all()
        return value


class RedfishCompositionBackend:
    def __init__(
        self,
        endpoint: str,
        username: str,
        password: str,
        *,
        connection: Connection = DEFAULT,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._client = redfish.redfish_client(
            base_url=self.endpoint,
            username=username,
            password=password,
            cafile=connection.ca_bundle(),
            timeout=connection.timeout,
            max_retry=0,
            check_connectivity=False,
            https_adapter=HTTPAdapter(pool_maxsize=connection.connections),
        )
        # The client mounts its adapter for https only; an http endpoint (the emulator, a
        # manager behind a TLS-terminating proxy) gets the same pool, or concurrent calls
        # beyond requests' 10 each open and drop a connection ("Connection pool is full").
        self._client._session.mount("http://", HTTPAdapter(pool_maxsize=connection.connections))
        self._lock = threading.Lock()  # guards logging in (the session's state)
        self._session_epoch = 0
        # The readers are looked up at each read, so that a test may wrap them.
        self._inventory = _SingleFlight(lambda: self._read_inventory())
        self._hosts = _SingleFlight(lambda: self._read_hosts())
        self._logged_in = False
        self._gpu_facts: dict[str, dict[str, Any]] = {}  # block id -> its GPU Processor
        self._action_targets: dict[tuple[str, str], str] = {}
        self._expand: members.Expand | None = None  # what the ServiceRoot advertises

    # -- transport -----------------------------------------------------------------------

    def _call(
        self, method: str, uri: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        # An expired session: logged in again, once (relogin.py).
        resp = once_more_after_401(
            lambda: self._send(method, uri, body, headers), self._forget_session, f"{method} {uri}"
        )
        answered = {k.lower(): v for k, v in resp.getheaders()}
        try:
            payload = resp.dict
        except Exception:
            payload = None
        return resp.status, payload, answered

    def _send(
        self, method: str, uri: str, body: Any, headers: dict[str, str] | None
    ) -> tuple[int, Any, int]:
        """One request, logged in first where needed: its status, the response and the
        session (its epoch) it went with."""
        try:
            # Logging in is serialised; requests then run concurrently on the session (its
            # connection pool is thread-safe), so one slow call does not hold up the others.
            with self._lock:
                if not self._logged_in:
                    self._client.login(auth="session")
                    self._logged_in = True
                session = self._session_epoch
            resp = self._request(method, uri, body, headers)
        except RetriesExhaustedError as exc:
            cause = exc.__cause__ or exc
            raise TransientError(f"{method} {uri}: {type(cause).__name__}: {cause}") from exc
        except redfish.rest.v1.InvalidCredentialsError as exc:
            self._forget_session()
            raise AuthError(f"login to {self.endpoint} refused") from exc
        except redfish.rest.v1.ServerDownOrUnreachableError as exc:
            self._forget_session()
            raise TransientError(f"{self.endpoint} unreachable: {exc}") from exc
        return resp.status, resp, session

    def _forget_session(self, epoch: int | None = None) -> None:
        """Log in again on the next call (once, however many calls saw the 401)."""
        with self._lock:
            if epoch is None or epoch == self._session_epoch:
                self._logged_in = False
                self._session_epoch += 1

    def _request(
        self, method: str, uri: str, body: Any, headers: dict[str, str] | None = None
    ) -> Any:
        if method == "GET":
            return self._client.get(uri, headers=headers)
        if method == "POST":
            return self._client.post(uri, body=body, headers=headers)
        if method == "PATCH":
            return self._client.patch(uri, body=body, headers=headers)
        if method == "DELETE":
            return self._client.delete(uri, headers=headers)
        raise ValueError(method)

    def _get(self, uri: str) -> dict[str, Any]:
        status, body, headers = self._call("GET", uri)
        if status != 200 or not isinstance(body, dict):
            raise error_for(status, body, headers, f"GET {uri}")
        return body

    def _collection(self, uri: str, levels: int = 1) -> list[dict[str, Any]]:
        """The members of a collection: one request a page where the service inlines them
        (``$expand``), else one more per member (members.py)."""
        if self._expand is None:
            self._expand = members.expand_of(self._get(f"{ROOT}/"))
        try:
            return members.members(self._get, uri, self.endpoint, self._expand, levels)
        except members.PagingError as exc:
            raise FabricError(str(exc)) from exc

    # -- reads ---------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        """Hosts, devices and zones: a read that started after this call did (shared by
        concurrent callers)."""
        return self._inventory.get()

    def hosts(self) -> dict[str, Host]:
        """The fabric's hosts: a read that started after this call did (shared)."""
        return self._hosts.get()

    def device(self, device_id: str) -> Device | None:
        """One GPU block read now (one request once its GPU's facts are known)."""
        uri = block_uri(device_id)
        status, body, headers = self._call("GET", uri)
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise error_for(status, body, headers, f"GET {uri}")
        return self._device_of(body)

    def _read_hosts(self) -> dict[str, Host]:
        hosts: dict[str, Host] = {}
        for system in self._collection(f"{ROOT}/Systems"):
            hosts[system["Id"]] = Host(
                system["Id"], str(system.get("UUID", "")), system.get("Name", "")
            )
        return hosts

    def _read_inventory(self) -> Inventory:
        hosts = self._read_hosts()
        devices: dict[str, Device] = {}
        system_block_host: dict[str, str] = {}
        # Two levels: each block with its GPU Processor, where the service can.
        for block in self._collection(BLOCKS, levels=2):
            if "ComputerSystem" in block.get("ResourceBlockType", []):
                systems = block.get("Links", {}).get("ComputerSystems", [])
                if systems:
                    system_block_host[block["Id"]] = _id(systems[0]["@odata.id"])
                continue
            device = self._device_of(block)
            if device is not None:
                devices[device.id] = device
        zones: dict[str, Zone] = {}
        for zone in self._collection(f"{ROOT}/CompositionService/ResourceZones"):
            ids = [_id(b["@odata.id"]) for b in zone.get("Links", {}).get("ResourceBlocks", [])]
            zones[zone["Id"]] = Zone(
                id=zone["Id"],
                hosts=frozenset(system_block_host[b] for b in ids if b in system_block_host),
                devices=frozenset(b for b in ids if b in devices),
            )
        return Inventory(hosts=hosts, devices=devices, zones=zones)

    def _device_of(self, block: dict[str, Any]) -> Device | None:
        """The Device a GPU block describes; None for any other block."""
        if "ComputerSystem" in block.get("ResourceBlockType", []):
            return None
        gpu = self._gpu_of(block)
        if gpu is None:
            return None
        links = block.get("Links", {})
        systems = [_id(s["@odata.id"]) for s in links.get("ComputerSystems", [])]
        comp = block.get("CompositionStatus", {})
        state = _STATE.get(comp.get("CompositionState", ""), "busy")
        zone_ids = [_id(z["@odata.id"]) for z in links.get("Zones", [])]
        memory = sum(int(m.get("CapacityMiB", 0)) for m in gpu.get("ProcessorMemory", []))
        return Device(
            id=block["Id"],
            model=str(gpu.get("Model", "")),
            zone=zone_ids[0] if zone_ids else "",
            uuid=str(gpu.get("UUID", "")),
            state=state,
            host=systems[0] if systems and state != "free" else None,
            memory_mib=memory,
            manufacturer=str(gpu.get("Manufacturer", "")),
            fault=redfish_fault(block, *self._inlined_gpus(block)),
        )

    @staticmethod
    def _inlined_gpus(block: dict[str, Any]) -> list[dict[str, Any]]:
        """The block's GPU Processors as $expand inlined them in this read (their Status
        changes, so never from the facts kept by ``_gpu_of``)."""
        return [p for p in block.get("Processors", []) if len(p) > 1]

    def _gpu_of(self, block: dict[str, Any]) -> dict[str, Any] | None:
        """The block's GPU Processor; its model, UUID and memory never change, so kept."""
        if block["Id"] not in self._gpu_facts:
            for ref in block.get("Processors", []):
                # Inlined by $expand, or only the link to read.
                proc = ref if len(ref) > 1 else self._get(ref["@odata.id"])
                if proc.get("ProcessorType") == "GPU":
                    self._gpu_facts[block["Id"]] = proc
                    break
            else:
                return None
        return self._gpu_facts[block["Id"]]

    # -- changes -------------------------------------------------------------------------

    def _action(self, host_id: str, action: str) -> str:
        key = (host_id, action)
        if key not in self._action_targets:
            system = self._get(f"{ROOT}/Systems/{host_id}")
            target = system.get("Actions", {}).get(f"#ComputerSystem.{action}", {}).get("target")
            if not target:
                raise OperationFailedError(f"system {host_id} has no {action} action")
            self._action_targets[key] = target
        return self._action_targets[key]

    def _change(self, action: str, device_id: str, host_id: str) -> Operation | None:
        target = self._action(host_id, action)
        body = {"ResourceBlock": {"@odata.id": block_uri(device_id)}}
        status, payload, headers = self._call("POST", target, body)
        return self._accepted(status, payload, headers, f"{action} {device_id} on {host_id}")

    def _accepted(
        self, status: int, payload: Any, headers: dict[str, str], what: str
    ) -> Operation | None:
        """The answer to a change: done (None), a task to follow, or a typed error."""
        if status in (200, 204):
            return None
        if status == 202:
            monitor = headers.get("location", "")
            task = payload.get("@odata.id") if isinstance(payload, dict) else None
            if not monitor and not task:
                raise OperationFailedError(f"{what}: 202 without a task monitor")
            return Operation(
                monitor=monitor or str(task),
                task=task,
                retry_after=poll_hint(headers.get("retry-after")),
            )
        raise error_for(status, payload, headers, what)

    def attach(self, device_id: str, host_id: str) -> Operation | None:
        return self._change("AddResourceBlock", device_id, host_id)

    def detach(self, device_id: str, host_id: str) -> Operation | None:
        return self._change("RemoveResourceBlock", device_id, host_id)

    def operation_status(self, op: Operation) -> OperationStatus:
        status, payload, headers = self._call("GET", op.monitor)
        if status == 202:
            return OperationStatus("running", retry_after=poll_hint(headers.get("retry-after")))
        if status in (200, 204) and not (isinstance(payload, dict) and "TaskState" in payload):
            return OperationStatus("done")
        if status >= 400 and status != 404 and op.task:
            # A monitor's last answer is the operation's own result; a failure there is
            # the task's failure, which the Task resource describes.
            ended = self._get(op.task)
            if ended.get("TaskState") in ("Exception", "Killed", "Cancelled"):
                return OperationStatus("failed", _describe(ended, f"task {ended['TaskState']}"))
            raise error_for(status, payload, headers, f"GET {op.monitor}")
        if status == 404 or (isinstance(payload, dict) and "TaskState" in payload):
            # The monitor is gone once the task ended: the Task resource tells how.
            task = payload if status != 404 else (self._get(op.task) if op.task else None)
            if task is None:
                raise NotFoundError(f"task monitor {op.monitor} is gone and no task is known")
            state = task.get("TaskState", "")
            if state == "Completed" and task.get("TaskStatus", "OK") in ("OK", "Warning"):
                return OperationStatus("done")
            if state in ("Completed", "Exception", "Killed", "Cancelled"):
                return OperationStatus("failed", _describe(task, f"task {state}"))
            return OperationStatus("running", retry_after=op.retry_after)
        raise error_for(status, payload, headers, f"GET {op.monitor}")

    def close(self) -> None:
        with self._lock:
            if self._logged_in:
                with contextlib.suppress(Exception):  # logging out is best effort
                    self._client.logout()
                self._logged_in = False
