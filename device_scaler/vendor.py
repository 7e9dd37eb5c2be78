"""Vendor-driver mode: completing an attach CoHDI's way (docs/operations.md).

A Fabric with ``vendorDriver`` has its pools published under a vendor's DRA driver (say
NVIDIA's). The scaler runs ``decide`` for that driver as for ours, and these pure functions
turn its one-cycle outcome into the reschedule path:

- where ``decide`` would set ``FabricDeviceReady`` (the resource is Online), the claim gets
  ``FabricDeviceReschedule`` instead, and only once the vendor's own slice for the node
  lists the GPU's UUID: the scheduler then un-reserves, deallocates and places the pod
  again, and the allocator (pools without binding conditions first) picks that local
  device. Until then the claim's status stays as it is;
- a rescheduled claim's resource is kept (``decide`` deletes the resource of any claim
  with a failure condition): it is released when the allocation ends, and from then on
  the idle rule sees the vendor's local device in use like one of ours;
- for drivers that do not see hot-plug, the vendor plugin's pods on the node are deleted
  (their DaemonSet starts them again) once per ``restartRetrySeconds`` while an Online
  GPU is missing from the node's slice. With ``--vendor-plugin-namespace`` (the chart
  sets it: its Role grants pod deletion there only), a Fabric naming another namespace
  gets no restarts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from api.v1alpha1 import ClaimRef, FabricSpec
from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import format_time, parse_time
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from device_scaler.decide import (
    Action,
    DeleteResource,
    PatchResource,
    ScalerSnapshot,
    SetDeviceStatus,
    Unquarantine,
    allocation_node,
    managed,
    resource_name,
)

ANN_RESTARTED = f"{names.PREFIX}/vendor-plugin-restarted-at"
RESCHEDULE_REASON = "VisibleToVendorDriver"


@dataclass(frozen=True)
class VendorMode:
    driver: str
    fabrics: frozenset[str]
    restart_namespace: str | None = None
    restart_selector: str | None = None
    restart_retry: float = 30.0
    # A restart namespace the Fabric asked for and the scaler may not delete pods in.
    refused_namespace: str | None = None


@dataclass(frozen=True)
class RestartVendorPlugin:
    """Delete the vendor plugin's pods on ``node`` (namespace, label selector)."""

    node: str
    namespace: str
    selector: str


@dataclass(frozen=True)
class Rescheduled:
    """For the record: a claim was sent back to the scheduler for a vendor local device."""

    claim: ClaimRef
    device: str
    local: str


VendorAction = Action | RestartVendorPlugin | Rescheduled


def vendor_modes(fabrics: Iterable[JSON], restart_namespace: str | None = None) -> list[VendorMode]:
    """One mode per vendor driver named by a Fabric (a Fabric the schema let through but
    this model refuses is left out). Fabrics sharing a driver share the first one's restart
    settings, by Fabric name. With ``restart_namespace``, restarts in any other namespace
    are refused (the mode restarts nothing and names the namespace it refused)."""
    by_driver: dict[str, list[tuple[str, FabricSpec]]] = {}
    for f in sorted(fabrics, key=lambda f: str((f.get("metadata") or {}).get("name", ""))):
        meta = f.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        try:
            spec = FabricSpec.model_validate(f.get("spec") or {})
        except ValidationError:
            continue
        if spec.vendor_driver is not None:
            by_driver.setdefault(spec.vendor_driver.name, []).append((str(meta["name"]), spec))
    modes = []
    for driver, specs in sorted(by_driver.items()):
        first = specs[0][1].vendor_driver
        assert first is not None
        restart = first.restart
        allowed = restart is not None and restart_namespace in (None, restart.namespace)
        modes.append(
            VendorMode(
                driver=driver,
                fabrics=frozenset(name for name, _ in specs),
                restart_namespace=restart.namespace if restart and allowed else None,
                restart_selector=restart.pod_selector if restart and allowed else None,
                restart_retry=float(first.restart_retry_seconds),
                refused_namespace=restart.namespace if restart and not allowed else None,
            )
        )
    return modes


def fabric_of(cr: JSON) -> str:
    return str((cr.get("spec") or {}).get("fabric", ""))


def _observed(claim: JSON | None, driver: str, pool: str, device: str) -> JSON | None:
    for st in ((claim or {}).get("status") or {}).get("devices") or []:
        if (st.get("driver"), st.get("pool"), st.get("device")) == (driver, pool, device):
            return {k: st[k] for k in ("driver", "pool", "device", "conditions", "data") if k in st}
    return None


def _is_true(entry: JSON | None, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (entry or {}).get("conditions") or []
    )


def _key(entry: JSON | None) -> object:
    if entry is None:
        return None
    conds = sorted((c.get("type"), c.get("status")) for c in entry.get("conditions") or [])
    return (conds, entry.get("data") or {})


def rescheduled_resources(s: ScalerSnapshot, driver: str) -> set[str]:
    """Resources whose claim this mode sent back to the scheduler: kept, not deleted."""
    out = set()
    for claim in s.claims:
        uid = str((claim.get("metadata") or {}).get("uid", ""))
        for st in (claim.get("status") or {}).get("devices") or []:
            if st.get("driver") != driver:
                continue
            for c in st.get("conditions") or []:
                if (
                    c.get("type") == names.FABRIC_DEVICE_RESCHEDULE
                    and c.get("status") == "True"
                    and c.get("reason") == RESCHEDULE_REASON
                ):
                    out.add(resource_name(uid, str(st.get("pool")), str(st.get("device"))))
    return out


def _reschedule_status(
    a: SetDeviceStatus, claim: JSON | None, s: ScalerSnapshot, driver: str
) -> tuple[SetDeviceStatus | None, list[Rescheduled]]:
    """``a`` with each FabricDeviceReady replaced by FabricDeviceReschedule once the vendor
    lists the GPU on the claim's node, or by what the claim has now until it does."""
    node = allocation_node(((claim or {}).get("status") or {}).get("allocation") or {})
    entries: list[JSON] = []
    done: list[Rescheduled] = []
    changed = False
    for e in a.entries:
        pool, device = str(e.get("pool")), str(e.get("device"))
        observed = _observed(claim, driver, pool, device)
        if _is_true(e, names.FABRIC_DEVICE_READY):
            uuid = normalize_uuid(str((e.get("data") or {}).get("uuid") or ""))
            local = s.local_devices.get((node or "", uuid))
            if local is None:
                if observed is not None:
                    entries.append(observed)
                continue  # not published by the vendor yet: the claim waits
            ready = (e.get("conditions") or [{}])[0]
            e = {
                "driver": driver,
                "pool": pool,
                "device": device,
                "conditions": [
                    {
                        **ready,
                        "type": names.FABRIC_DEVICE_RESCHEDULE,
                        "reason": RESCHEDULE_REASON,
                        "message": f"attached; {driver} publishes it on {node} as {local}",
                    }
                ],
                "data": e.get("data") or {},
            }
            done.append(Rescheduled(a.claim, device, local))
        entries.append(e)
        changed = changed or _key(observed) != _key(e)
    if not changed:
        return None, []
    return SetDeviceStatus(a.claim, entries, [], a.failed, a.version), done


def restarts(s: ScalerSnapshot, mode: VendorMode) -> list[VendorAction]:
    """Restart the vendor plugin on nodes where an Online GPU of a claim is still not in
    the vendor's slice, at most once per retry interval per resource."""
    if not (mode.restart_namespace and mode.restart_selector):
        return []
    out: list[VendorAction] = []
    nodes: set[str] = set()
    for cr in sorted(s.resources, key=lambda r: str(r["metadata"]["name"])):
        meta, spec, status = cr["metadata"], cr.get("spec") or {}, cr.get("status") or {}
        if fabric_of(cr) not in mode.fabrics or not managed(cr) or meta.get("deletionTimestamp"):
            continue
        if not spec.get("claimRef") or status.get("phase") != "Online":
            continue
        node = str(spec.get("targetNode", ""))
        uuid = normalize_uuid(str(status.get("deviceUUID") or ""))
        if not uuid or (node, uuid) in s.local_devices:
            continue
        last = parse_time((meta.get("annotations") or {}).get(ANN_RESTARTED))
        if last is not None and s.now - last < mode.restart_retry:
            continue
        if node not in nodes:
            nodes.add(node)
            out.append(RestartVendorPlugin(node, mode.restart_namespace, mode.restart_selector))
        out.append(
            PatchResource(
                str(meta["name"]),
                "VendorPluginRestarted",
                f"{mode.driver} does not list {uuid} on {node} yet; its plugin was restarted",
                patch={"metadata": {"annotations": {ANN_RESTARTED: format_time(s.now)}}},
            )
        )
    return out


def complete_vendor(
    actions: Sequence[Action], s: ScalerSnapshot, mode: VendorMode
) -> list[VendorAction]:
    """``decide``'s actions for ``mode.driver`` turned into the reschedule path."""
    claims = {str((c.get("metadata") or {}).get("uid", "")): c for c in s.claims}
    keep = rescheduled_resources(s, mode.driver)
    out: list[VendorAction] = []
    for a in actions:
        if isinstance(a, SetDeviceStatus):
            rewritten, done = _reschedule_status(a, claims.get(a.claim.uid), s, mode.driver)
            if rewritten is not None:
                out.append(rewritten)
                out.extend(done)
        elif isinstance(a, DeleteResource) and a.name in keep:
            continue
        elif isinstance(a, Unquarantine):
            continue  # the pass for our own driver sees every quarantine rule and ends it
        else:
            out.append(a)
    return out + restarts(s, mode)
