"""Prepare and unprepare: the decisions (pure functions of the claim) and their effects.

``plan_claim`` turns one ResourceClaim (a plain dict, as the API server returned it) into
the devices to prepare, or a :class:`ClaimError` naming what is wrong with that claim.
:class:`Preparer` adds the effects (checkpoint, CDI spec) under one lock, so concurrent
prepare and unprepare calls never interleave, in this process or in another instance
sharing the checkpoint during a rolling update.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from api.v1alpha1 import ClaimRef
from composable_dra.lending.qos import QosProfile
from composable_dra.model.gpu_config import ConfigError, GpuConfig, claim_configs
from composable_dra.model.names import normalize_uuid
from composable_dra.process import logs
from dra_driver import cdi, claimref, metrics
from dra_driver.checkpoint import Checkpoint, ClaimRecord, PreparedDevice, RemoteLeaseRecord
from dra_driver.device_source import DeviceInfo
from dra_driver.remote_key import RemoteKey, recorded_key
from dra_driver.remote_prepare import (
    RemoteClaimError,
    RemoteLeases,
    RemotePlanned,
    container_lease_dir,
    is_remote,
    plan_remote,
)


class ClaimError(Exception):
    """What is wrong with one claim; reported in that claim's response entry only."""


class ClaimNotFound(ClaimError):
    pass


@dataclass(frozen=True)
class PlannedDevice:
    request: str
    pool_name: str
    device_name: str
    device: DeviceInfo
    config: GpuConfig
    shareable: bool
    share_id: str | None = None


@dataclass
class PrepareResult:
    devices: list[PreparedDevice] = field(default_factory=list)
    error: str = ""


def _shareable(result: dict[str, Any], config: GpuConfig) -> bool:
    return (
        bool(result.get("adminAccess")) or config.sharing == "Shared" or bool(result.get("shareID"))
    )


def _device_status_uuid(claim: dict[str, Any], driver: str, pool: str, device: str) -> str | None:
    """The UUID a pool device resolved to, as the scaler recorded it in the claim status."""
    for st in (claim.get("status") or {}).get("devices") or []:
        if (st.get("driver"), st.get("pool"), st.get("device")) == (driver, pool, device):
            data = st.get("data") or {}
            uuid = data.get("uuid") if isinstance(data, dict) else None
            return str(uuid) if uuid else None
    return None


def plan_claim(
    claim: dict[str, Any],
    ref: ClaimRef,
    driver: str,
    node_name: str,
    devices: Sequence[DeviceInfo],
    in_use: dict[str, list[tuple[str, bool]]],
) -> list[PlannedDevice]:
    """The devices of ``claim`` this plugin prepares, checked against what is in use.

    ``in_use`` maps a local device name to the (claim UID, shareable) pairs holding it.
    Results of other drivers are skipped; a claim with none of ours prepares nothing.
    """
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise ClaimError(
            f"claim {ref.namespace}/{ref.name} has UID {meta.get('uid')}, kubelet asked for"
            f" {ref.uid}: the claim was replaced"
        )
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"claim {ref.namespace}/{ref.name} is not allocated")
    alloc_devices = allocation.get("devices") or {}
    try:
        configs = claim_configs(alloc_devices.get("config") or [], driver)
    except ConfigError as exc:
        raise ClaimError(f"claim {ref.namespace}/{ref.name}: {exc}") from None

    by_name = {d.name: d for d in devices}
    # One GPU's UUID in whatever form its source gives it ("GPU-<uuid>" from NVML or an
    # Fsas FM, the bare UUID from Redfish): the claim status carries the fabric's form.
    by_uuid = {normalize_uuid(d.uuid): d for d in devices}
    planned: list[PlannedDevice] = []
    for result in alloc_devices.get("results") or []:
        if result.get("driver") != driver or is_remote(result, node_name):
            continue  # remote devices: ``remote_prepare``
        pool, name, request = (
            result.get("pool", ""),
            result.get("device", ""),
            result.get("request", ""),
        )
        if pool == node_name:
            dev = by_name.get(name)
            if dev is None:
                raise ClaimError(f"device {name} is not present on node {node_name}")
        else:
            uuid = _device_status_uuid(claim, driver, pool, name)
            if uuid is None:
                raise ClaimError(f"pool device {pool}/{name} has no UUID in the claim status yet")
            dev = by_uuid.get(normalize_uuid(uuid))
            if dev is None:
                raise ClaimError(f"pool device {pool}/{name} (UUID {uuid}) is not visible here")
        config = configs.for_request(request)
        shareable = _shareable(result, config)
        holders = [(uid, ok) for uid, ok in in_use.get(dev.name, []) if uid != ref.uid]
        if holders and not (shareable and all(ok for _, ok in holders)):
            raise ClaimError(
                f"device {dev.name} is already prepared for claim {holders[0][0]} and the"
                " allocations do not allow sharing"
            )
        planned.append(
            PlannedDevice(
                request=request,
                pool_name=pool,
                device_name=name,
                device=dev,
                config=config,
                shareable=shareable,
                share_id=result.get("shareID"),
            )
        )
    return planned


def in_use_map(records: Sequence[ClaimRecord]) -> dict[str, list[tuple[str, bool]]]:
    out: dict[str, list[tuple[str, bool]]] = {}
    for rec in records:
        for dev in rec.devices:
            out.setdefault(dev.local_name, []).append((rec.uid, dev.shareable))
    return out


def build_record(
    ref: ClaimRef,
    planned: Sequence[PlannedDevice],
    remote: Sequence[tuple[RemotePlanned, str]] = (),
) -> ClaimRecord:
    """The checkpoint record (state ``preparing``) and CDI spec for a planned claim;
    ``remote``: its remote devices with their lease directories (``remote_key``'s
    layout: by pool and device)."""
    cdi_devices = [
        cdi.CdiDevice(
            device_name=p.device.name,
            uuid=p.device.uuid,
            env=dict(p.config.env),
            device_nodes=p.device.device_nodes,
        )
        for p in planned
    ]
    devices = [
        PreparedDevice(
            request_names=[p.request],
            pool_name=p.pool_name,
            device_name=p.device_name,
            local_name=p.device.name,
            uuid=p.device.uuid,
            cdi_device_ids=[cdi.cdi_device_id(ref.uid, p.device.name)],
            shareable=p.shareable,
            share_id=p.share_id,
            qos=p.config.qos,
        )
        for p in planned
    ]
    remote_cdi = [remote_cdi_device(_key(ref.uid, r), r, directory) for r, directory in remote]
    devices += [
        PreparedDevice(
            request_names=[r.request],
            pool_name=r.donor,
            device_name=r.device,
            local_name=r.device,
            uuid="",
            cdi_device_ids=[_key(ref.uid, r).cdi_id()],
            remote=RemoteLeaseRecord(donor=r.donor, lease=r.lease, endpoint=r.endpoint),
        )
        for r, _ in remote
    ]
    return ClaimRecord(
        uid=ref.uid,
        namespace=ref.namespace,
        name=ref.name,
        state="preparing",
        devices=devices,
        cdi_spec=cdi.build_spec(ref.uid, cdi_devices, remote_cdi) if devices else {},
    )


def _key(claim_uid: str, r: RemotePlanned) -> RemoteKey:
    """The key a device prepared now gets: by its pool and name."""
    return RemoteKey(claim_uid, r.donor, r.device)


def remote_cdi_device(key: RemoteKey, r: RemotePlanned, directory: str) -> cdi.RemoteCdiDevice:
    return cdi.RemoteCdiDevice(
        name=key.cdi_name(),
        endpoint=r.endpoint,
        lease=r.lease,
        directory=directory,
        container_directory=container_lease_dir(key),
    )


def recorded_keys(record: ClaimRecord) -> dict[tuple[str, str], RemoteKey]:
    """(pool, device) -> the key each remote device of ``record`` was prepared under."""
    return {
        (d.pool_name, d.device_name): recorded_key(record.uid, d)
        for d in record.devices
        if d.remote is not None
    }


def refreshed_record(
    record: ClaimRecord, stale: Sequence[RemotePlanned], directory: Callable[[RemoteKey], str]
) -> ClaimRecord:
    """``record`` with the re-opened leases of ``stale``: each device's lease and endpoint,
    and its CDI device's edits (what a container started from now on gets);
    ``directory(key)``: the device's lease directory on the host."""
    new = {(r.donor, r.device): r for r in stale}
    remote = [(d.pool_name, d.device_name) for d in record.devices if d.remote is not None]
    devices = [
        d.model_copy(update={"remote": RemoteLeaseRecord(
            donor=d.pool_name, lease=r.lease, endpoint=r.endpoint
        )})
        if d.remote is not None and (r := new.get((d.pool_name, d.device_name)))
        else d
        for d in record.devices
    ]  # fmt: skip
    keys = recorded_keys(record)
    spec = dict(record.cdi_spec)
    edits = {
        keys[r.donor, r.device].cdi_name(): cdi.remote_edits(
            remote_cdi_device(keys[r.donor, r.device], r, directory(keys[r.donor, r.device])),
            remote.index((r.donor, r.device)),
            len(remote),
        )
        for r in stale
    }
    spec["devices"] = [
        {**d, "containerEdits": edits[d["name"]]} if d.get("name") in edits else d
        for d in spec.get("devices") or []
    ]
    return record.model_copy(update={"devices": devices, "cdi_spec": spec})


ClaimGetter = Callable[[str, str], dict[str, Any]]


class Preparer:
    """Prepare and unprepare with their effects, one call at a time."""

    def __init__(
        self,
        driver: str,
        node_name: str,
        get_claim: ClaimGetter,
        devices: Callable[[], Sequence[DeviceInfo]],
        checkpoint: Checkpoint,
        cdi_writer: cdi.CdiWriter,
        remote: RemoteLeases | None = None,
    ) -> None:
        self.driver, self.node_name = driver, node_name
        self._get_claim = get_claim
        self._devices = devices
        self._checkpoint = checkpoint
        self._cdi = cdi_writer
        self._remote = remote
        self._lock = threading.Lock()
        self._log = logs.get(__name__, node=node_name)
        # Called after each prepare and unprepare (the health stream sends the claims'
        # devices at once, so a new pod's status shows their health without a wait).
        self.listeners: list[Callable[[], None]] = []
        metrics.PREPARED_CLAIMS.set(len(checkpoint.claims))

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        out: dict[str, PrepareResult] = {}
        with self._lock, self._checkpoint.exclusive():
            for ref in refs:
                start = time.perf_counter()
                try:
                    out[ref.uid] = PrepareResult(devices=self._prepare_one(ref))
                    outcome = "ok"
                except ClaimError as exc:
                    out[ref.uid] = PrepareResult(error=str(exc))
                    outcome = "error"
                except Exception as exc:  # an API or disk failure: still one entry per claim
                    self._log.exception("prepare failed", claim=ref.uid)
                    out[ref.uid] = PrepareResult(error=f"prepare failed: {exc}")
                    outcome = "error"
                metrics.PREPARE_SECONDS.labels(outcome).observe(time.perf_counter() - start)
                if outcome == "error":
                    self._log.warning(
                        "claim not prepared",
                        claim=f"{ref.namespace}/{ref.name}",
                        uid=ref.uid,
                        error=out[ref.uid].error,
                    )
            metrics.PREPARED_CLAIMS.set(len(self._checkpoint.claims))
        self._notify()
        return out

    def _notify(self) -> None:
        for listener in self.listeners:
            listener()

    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        why = claimref.problem(ref.namespace, ref.name, ref.uid)
        if why is not None:  # the gRPC edge refuses these first; callers may not be it
            raise ClaimError(why)
        existing = self._checkpoint.get(ref.uid)
        if existing is not None and existing.state == "prepared":
            if (existing.namespace, existing.name) != (ref.namespace, ref.name):
                raise ClaimError(
                    f"claim UID {ref.uid} was prepared as {existing.namespace}/{existing.name}"
                )
            # Idempotent: same answer, and the spec restored if someone removed it.
            if existing.cdi_spec and self._cdi.read(ref.uid) != existing.cdi_spec:
                self._cdi.write(ref.uid, existing.cdi_spec)
            return existing.devices

        claim = self._get_claim(ref.namespace, ref.name)
        others = [r for uid, r in self._checkpoint.claims.items() if uid != ref.uid]
        planned = plan_claim(
            claim, ref, self.driver, self.node_name, self._devices(), in_use_map(others)
        )
        try:
            remote = plan_remote(claim, self.driver, self.node_name)
        except RemoteClaimError as exc:
            raise ClaimError(f"claim {ref.namespace}/{ref.name}: {exc}") from None
        if remote and self._remote is None:
            raise ClaimError("this plugin has no --lease-token-file: no remote GPUs here")
        paths = [(r, str(self._remote.lease_dir(_key(ref.uid, r)))) for r in remote if self._remote]
        record = build_record(ref, planned, paths)
        # Phase one: the devices are reserved before anything is written for them (and a
        # crash from here on leaves a record whose unprepare removes the token files).
        self._checkpoint.put(record)
        for r in remote:
            assert self._remote is not None
            try:
                self._remote.fetch(_key(ref.uid, r), r)
            except RemoteClaimError as exc:
                raise ClaimError(f"claim {ref.namespace}/{ref.name}: {exc}") from None
        if record.cdi_spec:
            self._cdi.write(ref.uid, record.cdi_spec)
        # Phase two: prepared, the answer every later call repeats.
        self._checkpoint.put(record.model_copy(update={"state": "prepared"}))
        self._log.info(
            "claim prepared",
            claim=f"{ref.namespace}/{ref.name}",
            uid=ref.uid,
            device=[d.local_name for d in record.devices],
        )
        return record.devices

    def refresh_remote(self, uid: str, stale: Sequence[RemotePlanned]) -> bool:
        """Collect the re-opened leases' credentials into their directories (which the
        running containers see) and record them, with the CDI spec's env. False when the
        claim is no longer prepared here; RemoteClaimError when a donor refuses."""
        with self._lock, self._checkpoint.exclusive():
            record = self._checkpoint.get(uid)
            leases = self._remote
            if record is None or record.state != "prepared" or leases is None:
                return False
            keys = recorded_keys(record)
            for r in stale:
                leases.fetch(keys[r.donor, r.device], r)
            updated = refreshed_record(record, stale, lambda k: str(leases.lease_dir(k)))
            if updated.cdi_spec:
                self._cdi.write(uid, updated.cdi_spec)
            self._checkpoint.put(updated)
        self._log.info(
            "remote leases refreshed",
            claim=f"{record.namespace}/{record.name}",
            uid=uid,
            lease=[r.lease for r in stale],
        )
        return True

    def prepared_devices(self) -> list[PreparedDevice]:
        """Every device of every claim prepared here (the health stream's identities)."""
        with self._lock:
            records = list(self._checkpoint.claims.values())
        return [d for r in records for d in r.devices]

    def prepared_claims(self) -> list[ClaimRecord]:
        """The claims prepared here (the donor health source reads their remote devices)."""
        with self._lock:
            return [r for r in self._checkpoint.claims.values() if r.state == "prepared"]

    def held(self) -> list[tuple[str, QosProfile | None]]:
        """This node's devices held by a claim, each with the QoS profile its claim
        declared (None: none), for the QoS attributes (``lend_status``)."""
        with self._lock:
            records = list(self._checkpoint.claims.values())
        return [
            (d.local_name, d.qos.profile() if d.qos else None)
            for r in records
            for d in r.devices
            if d.remote is None
        ]

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Claim UID -> error ("" for success). Unknown claims succeed."""
        out: dict[str, str] = {}
        with self._lock, self._checkpoint.exclusive():
            for ref in refs:
                start = time.perf_counter()
                why = claimref.problem(ref.namespace, ref.name, ref.uid)
                if why is not None:
                    out[ref.uid] = why
                    metrics.UNPREPARE_SECONDS.labels("error").observe(time.perf_counter() - start)
                    continue
                try:
                    self._release_remote(ref)
                    removed_spec = self._cdi.remove(ref.uid)
                    removed_entry = self._checkpoint.remove(ref.uid)
                    out[ref.uid] = ""
                    if removed_spec or removed_entry:
                        self._log.info(
                            "claim unprepared", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid
                        )
                    outcome = "ok"
                except Exception as exc:
                    self._log.exception("unprepare failed", claim=ref.uid)
                    out[ref.uid] = f"unprepare failed: {exc}"
                    outcome = "error"
                metrics.UNPREPARE_SECONDS.labels(outcome).observe(time.perf_counter() - start)
            metrics.PREPARED_CLAIMS.set(len(self._checkpoint.claims))
        self._notify()
        return out

    def _release_remote(self, ref: ClaimRef) -> None:
        """Token files gone and leases closed at their donors, before the record goes."""
        record = self._checkpoint.get(ref.uid)
        held = [
            (recorded_key(ref.uid, d), d.remote.donor, d.remote.lease)
            for d in (record.devices if record else [])
            if d.remote is not None
        ]
        if held and self._remote is not None:
            self._remote.release(held)
