"""The NVML health source: what the NVIDIA driver says of each GPU's health.

Three signs, each turned into the suite's one health model (composable_dra.model.health):

- XID events (NVML's critical-XID event set). The driver logs an XID for faults of the
  application as well as of the device; those of the application (``APPLICATION_XIDS``: an
  illegal instruction, a page fault, a stopped or cleaned-up context, a video engine
  exception) leave the GPU fine for the next pod, as NVIDIA's own device plugin treats
  them. XID 79 means the GPU fell off the bus: ``GpuLost``. Every other XID that reaches
  the critical event set is a device fault (``XidError``) and stays until the GPU leaves
  the host, since only a reset clears it and the plugin sees no reset.
- Volatile uncorrected (double-bit) ECC errors since the driver loaded: ``EccError``.
- NVML_ERROR_GPU_IS_LOST from any call about the GPU: ``GpuLost``.

``NvmlHealth`` implements the plugin's health-source seam (``name`` and ``reports``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from composable_dra.model.health import Health, HealthReport, Reason
from dra_driver.device_source import device_name_for
from dra_driver.sources.nvml import nvml_text

SOURCE = "nvml"
# XIDs of the application, not the device (NVIDIA's XID catalogue: 13 graphics engine
# exception, 31 GPU memory page fault, 43 GPU stopped processing, 45 preemptive cleanup,
# 68 video processor exception, 109 context switch timeout).
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# The GPU has fallen off the bus: nothing on it answers any more.
LOST_XIDS = frozenset({79})
MAX_EVENTS_PER_POLL = 256  # a storm of XIDs does not hold the source forever


def classify_xid(xid: int) -> Reason | None:
    """The health reason an XID means for its GPU; None for an application's own error."""
    if xid in APPLICATION_XIDS:
        return None
    if xid in LOST_XIDS:
        return Reason.GPU_LOST
    return Reason.XID_ERROR


@dataclass(frozen=True)
class GpuFacts:
    """What NVML said of one GPU, gathered by ``NvmlHealth``."""

    uuid: str
    lost: bool = False
    ecc_uncorrected: int = 0
    xids: tuple[int, ...] = ()  # device-fault XIDs seen since the GPU came


def judge(facts: GpuFacts) -> HealthReport:
    """One GPU's report: the worst sign wins (lost, then ECC, then an XID)."""
    name = device_name_for(facts.uuid)

    def bad(reason: Reason, message: str) -> HealthReport:
        return HealthReport(name, Health.UNHEALTHY, reason, message, SOURCE)

    lost_xids = [x for x in facts.xids if classify_xid(x) is Reason.GPU_LOST]
    if facts.lost or lost_xids:
        how = f"XID {lost_xids[0]}" if lost_xids else "NVML_ERROR_GPU_IS_LOST"
        return bad(Reason.GPU_LOST, f"{facts.uuid} is lost ({how}); it needs a reset")
    if facts.ecc_uncorrected > 0:
        return bad(
            Reason.ECC_ERROR,
            f"{facts.uuid}: {facts.ecc_uncorrected} uncorrected (double-bit) ECC errors",
        )
    faults = [x for x in facts.xids if classify_xid(x) is Reason.XID_ERROR]
    if faults:
        listed = ", ".join(str(x) for x in sorted(set(faults)))
        return bad(Reason.XID_ERROR, f"{facts.uuid}: XID {listed}")
    return HealthReport(name, Health.HEALTHY, source=SOURCE)


@dataclass
class _Seen:
    """What the source keeps between polls: the GPUs it registered and their XIDs."""

    registered: set[str] = field(default_factory=set)
    xids: dict[str, list[int]] = field(default_factory=dict)


class NvmlHealth:
    """Reads NVML on each ``reports`` call (the plugin's health board ticks it)."""

    name = SOURCE

    def __init__(self, nvml: Any = None) -> None:
        """``nvml`` is the pynvml module; tests hand in a fake one."""
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml = nvml
        self._lock = threading.Lock()
        self._events: Any = None
        self._seen = _Seen()

    def reports(self) -> Iterable[HealthReport]:
        nv = self._nvml
        with self._lock:
            if self._events is None:
                nv.nvmlInit()
                self._events = nv.nvmlEventSetCreate()
            handles = self._handles()
            self._drain(handles)
            facts = [self._facts(uuid, handle) for uuid, handle in handles.items()]
            self._forget(set(handles))
            return [judge(f) for f in facts]

    def _handles(self) -> dict[str, Any]:
        """The GPUs listed now (and those lost since they were seen), by UUID; each new one
        is registered for critical XIDs."""
        nv = self._nvml
        found: dict[str, Any] = {}
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml_text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError:
                continue  # a lost GPU at an index: found again below by its UUID
            found[uuid] = handle
        for uuid in self._seen.registered - set(found):
            if self._lost(lambda u=uuid: nv.nvmlDeviceGetHandleByUUID(u)):
                found[uuid] = None  # lost, not gone: keep reporting it
        for uuid, handle in found.items():
            if handle is not None and uuid not in self._seen.registered:
                try:
                    nv.nvmlDeviceRegisterEvents(
                        handle, nv.nvmlEventTypeXidCriticalError, self._events
                    )
                except nv.NVMLError:
                    continue  # not supported on this GPU: its other signs still count
                self._seen.registered.add(uuid)
        return found

    def _drain(self, handles: dict[str, Any]) -> None:
        """Every XID waiting in the event set, kept per GPU (application XIDs left out)."""
        nv = self._nvml
        for _ in range(MAX_EVENTS_PER_POLL):
            try:
                event = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError:
                return  # NVML_ERROR_TIMEOUT: none waiting
            try:
                uuid = nvml_text(nv.nvmlDeviceGetUUID(event.device))
            except nv.NVMLError:
                continue
            xid = int(event.eventData)
            if uuid in handles and classify_xid(xid) is not None:
                self._seen.xids.setdefault(uuid, []).append(xid)

    def _facts(self, uuid: str, handle: Any) -> GpuFacts:
        nv = self._nvml
        xids = tuple(self._seen.xids.get(uuid, ()))
        if handle is None:
            return GpuFacts(uuid, lost=True, xids=xids)
        ecc = 0

        def read() -> None:
            nonlocal ecc
            ecc = int(
                nv.nvmlDeviceGetTotalEccErrors(
                    handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                )
            )

        lost = self._lost(read)
        return GpuFacts(uuid, lost=lost, ecc_uncorrected=ecc, xids=xids)

    def _lost(self, call: Any) -> bool:
        """Whether ``call`` says the GPU is lost (other errors: not a health sign)."""
        nv = self._nvml
        try:
            call()
        except nv.NVMLError as exc:
            return bool(getattr(exc, "value", None) == nv.NVML_ERROR_GPU_IS_LOST)
        return False

    def _forget(self, present: set[str]) -> None:
        """A GPU that left the host takes its XIDs with it (it comes back reset)."""
        for uuid in set(self._seen.xids) - present:
            del self._seen.xids[uuid]
        self._seen.registered &= present

    def close(self) -> None:
        with self._lock:
            if self._events is not None:
                self._nvml.nvmlEventSetFree(self._events)
                self._nvml.nvmlShutdown()
                self._events = None
