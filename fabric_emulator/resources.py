"""Redfish payloads, rendered from the topology and the composition (pure functions).

``render(view, path)`` answers a GET: the resource's JSON, or None when there is none.
Every link is derived from the same state, so both ends of a link always agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fabric_emulator.state import Composition, system_block_id
from fabric_emulator.topology import Block, Topology

ROOT = "/redfish/v1"
COMP = f"{ROOT}/CompositionService"
BLOCKS = f"{COMP}/ResourceBlocks"
ZONES = f"{COMP}/ResourceZones"
MANAGER_ID = "FabricManager"
SERVICE_UUID = "8a7f3c2e-5d1b-5f0a-b6c4-2e9d7a1f3b58"

# Schema versions served (the newest in the January 2026 CSDL bundle).
TYPES: dict[str, str] = {
    "ServiceRoot": "v1_20_0",
    "ComputerSystem": "v1_27_0",
    "CompositionService": "v1_2_3",
    "ResourceBlock": "v1_4_3",
    "Zone": "v1_6_3",
    "Processor": "v1_22_0",
    "SessionService": "v1_2_0",
    "Session": "v1_8_0",
    "AccountService": "v1_18_1",
    "ManagerAccount": "v1_14_1",
    "Role": "v1_3_3",
    "Manager": "v1_24_0",
    "Chassis": "v1_28_0",
    "TaskService": "v1_3_0",
    "Task": "v1_7_4",
    "ActionInfo": "v1_5_0",
}
COLLECTIONS = (
    "ComputerSystemCollection",
    "ResourceBlockCollection",
    "ZoneCollection",
    "ProcessorCollection",
    "SessionCollection",
    "ManagerAccountCollection",
    "RoleCollection",
    "ManagerCollection",
    "ChassisCollection",
    "TaskCollection",
)


def odata_type(name: str) -> str:
    if name in TYPES:
        return f"#{name}.{TYPES[name]}.{name}"
    return f"#{name}.{name}"


def link(uri: str) -> dict[str, str]:
    return {"@odata.id": uri}


def _ok() -> dict[str, str]:
    return {"State": "Enabled", "Health": "OK"}


def collection(kind: str, uri: str, name: str, members: list[str]) -> dict[str, Any]:
    return {
        "@odata.id": uri,
        "@odata.type": odata_type(kind),
        "Name": name,
        "Members@odata.count": len(members),
        "Members": [link(m) for m in members],
    }


def enclosure_id(zone_id: str) -> str:
    return f"enclosure-{zone_id}"


@dataclass(frozen=True)
class SessionInfo:
    id: str
    user: str
    created: str


@dataclass(frozen=True)
class View:
    """What a GET sees: fixed topology, current composition, sessions and tasks."""

    topology: Topology
    comp: Composition
    sessions: dict[str, SessionInfo]
    tasks: dict[str, dict[str, Any]]  # task id -> rendered Task
    user: str


# ---- service root and protocol documents -------------------------------------------------


def service_root(v: View) -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/",
        "@odata.type": odata_type("ServiceRoot"),
        "Id": "RootService",
        "Name": "Composable DRA fabric emulator",
        "RedfishVersion": "1.21.0",
        "UUID": SERVICE_UUID,
        "Vendor": "composable-dra",
        "Product": "Redfish fabric emulator",
        "ProtocolFeaturesSupported": {
            "ExpandQuery": {"ExpandAll": False, "Levels": False, "Links": False, "NoLinks": False},
            "SelectQuery": False,
            "FilterQuery": False,
            "OnlyMemberQuery": False,
            "ExcerptQuery": False,
        },
        "Systems": link(f"{ROOT}/Systems"),
        "Chassis": link(f"{ROOT}/Chassis"),
        "Managers": link(f"{ROOT}/Managers"),
        "SessionService": link(f"{ROOT}/SessionService"),
        "AccountService": link(f"{ROOT}/AccountService"),
        "CompositionService": link(COMP),
        "Tasks": link(f"{ROOT}/TaskService"),
        "Links": {"Sessions": link(f"{ROOT}/SessionService/Sessions")},
    }


def odata_document() -> dict[str, Any]:
    names = [
        ("Service", f"{ROOT}/"),
        ("Systems", f"{ROOT}/Systems"),
        ("Chassis", f"{ROOT}/Chassis"),
        ("Managers", f"{ROOT}/Managers"),
        ("SessionService", f"{ROOT}/SessionService"),
        ("AccountService", f"{ROOT}/AccountService"),
        ("CompositionService", COMP),
        ("Tasks", f"{ROOT}/TaskService"),
    ]
    return {
        "@odata.context": f"{ROOT}/$metadata",
        "value": [{"name": n, "kind": "Singleton", "url": u} for n, u in names],
    }


def metadata_xml() -> str:
    """``$metadata``: a reference to every schema whose types the service returns."""
    refs: list[str] = []
    for name, version in sorted(TYPES.items()):
        refs.append(
            f'  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/{name}_v1.xml">\n'
            f'    <edmx:Include Namespace="{name}"/>\n'
            f'    <edmx:Include Namespace="{name}.{version}"/>\n'
            f"  </edmx:Reference>"
        )
    for name in COLLECTIONS:
        refs.append(
            f'  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/{name}_v1.xml">\n'
            f'    <edmx:Include Namespace="{name}"/>\n'
            f"  </edmx:Reference>"
        )
    for name, ns in (
        ("RedfishExtensions", "RedfishExtensions.v1_0_0"),
        ("Resource", "Resource.v1_0_0"),
        ("Message", "Message.v1_0_0"),
    ):
        refs.append(
            f'  <edmx:Reference Uri="http://redfish.dmtf.org/schemas/v1/{name}_v1.xml">\n'
            f'    <edmx:Include Namespace="{name}"/>\n'
            f'    <edmx:Include Namespace="{ns}"/>\n'
            f"  </edmx:Reference>"
        )
    body = "\n".join(refs)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">\n'
        f"{body}\n"
        "  <edmx:DataServices>\n"
        '    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">\n'
        '      <EntityContainer Name="Service" '
        f'Extends="ServiceRoot.{TYPES["ServiceRoot"]}.ServiceContainer"/>\n'
        "    </Schema>\n"
        "  </edmx:DataServices>\n"
        "</edmx:Edmx>\n"
    )


# ---- systems -----------------------------------------------------------------------------


def _system(v: View, host_id: str) -> dict[str, Any]:
    host = v.topology.hosts[host_id]
    uri = f"{ROOT}/Systems/{host_id}"
    blocks = [system_block_id(host_id), *v.comp.blocks_of(host_id)]
    return {
        "@odata.id": uri,
        "@odata.type": odata_type("ComputerSystem"),
        "Id": host_id,
        "Name": host.name,
        "SystemType": "Physical",
        "Composition": {"UseCases": ["ExpandableSystem"]},
        "UUID": host.uuid,
        "HostName": host_id,
        "PowerState": "On",
        "Status": _ok(),
        "ProcessorSummary": {"Count": 1 + len(v.comp.blocks_of(host_id))},
        "Processors": link(f"{uri}/Processors"),
        "Links": {
            "Chassis": [link(f"{ROOT}/Chassis/{host_id}")],
            "ManagedBy": [link(f"{ROOT}/Managers/{MANAGER_ID}")],
            "ResourceBlocks": [link(f"{BLOCKS}/{b}") for b in blocks],
        },
        "Actions": {
            "#ComputerSystem.AddResourceBlock": {
                "target": f"{uri}/Actions/ComputerSystem.AddResourceBlock",
                "@Redfish.ActionInfo": f"{uri}/AddResourceBlockActionInfo",
            },
            "#ComputerSystem.RemoveResourceBlock": {
                "target": f"{uri}/Actions/ComputerSystem.RemoveResourceBlock",
                "@Redfish.ActionInfo": f"{uri}/RemoveResourceBlockActionInfo",
            },
        },
    }


def _action_info(host_id: str, action: str) -> dict[str, Any]:
    short = action.split(".")[1]
    return {
        "@odata.id": f"{ROOT}/Systems/{host_id}/{short}ActionInfo",
        "@odata.type": odata_type("ActionInfo"),
        "Id": f"{short}ActionInfo",
        "Name": f"{short} action parameters",
        "Parameters": [
            {
                "Name": "ResourceBlock",
                "Required": True,
                "DataType": "Object",
                "ObjectDataType": "#ResourceBlock.ResourceBlock",
            },
            {"Name": "ResourceBlockETag", "Required": False, "DataType": "String"},
            {"Name": "ComputerSystemETag", "Required": False, "DataType": "String"},
        ],
    }


def _cpu(host_id: str) -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/Systems/{host_id}/Processors/CPU0",
        "@odata.type": odata_type("Processor"),
        "Id": "CPU0",
        "Name": "Host CPU",
        "ProcessorType": "CPU",
        "Manufacturer": "Emulated",
        "Model": "Emulated host CPU",
        "TotalCores": 32,
        "TotalThreads": 64,
        "Status": _ok(),
        "Links": {"Chassis": link(f"{ROOT}/Chassis/{host_id}")},
    }


def _gpu(block: Block, uri: str, pid: str) -> dict[str, Any]:
    return {
        "@odata.id": uri,
        "@odata.type": odata_type("Processor"),
        "Id": pid,
        "Name": f"GPU of resource block {block.id}",
        "ProcessorType": "GPU",
        "Manufacturer": block.manufacturer,
        "Model": block.model,
        "UUID": block.redfish_uuid,
        "ProcessorMemory": [
            {
                "IntegratedMemory": True,
                "MemoryType": block.memory_type,
                "CapacityMiB": block.memory_mib,
            }
        ],
        "Status": _ok(),
        "Links": {"Chassis": link(f"{ROOT}/Chassis/{enclosure_id(block.zone)}")},
    }


# ---- composition service -----------------------------------------------------------------


def _gpu_block(v: View, block_id: str) -> dict[str, Any]:
    block = v.topology.blocks[block_id]
    state = v.comp.state_of(block_id)
    host = v.comp.attached.get(block_id)
    return {
        "@odata.id": f"{BLOCKS}/{block_id}",
        "@odata.type": odata_type("ResourceBlock"),
        "Id": block_id,
        "Name": f"GPU block {block_id}",
        "Description": f"{block.model} in {block.zone}",
        "ResourceBlockType": ["Processor"],
        "Status": _ok(),
        "Pool": "Active" if state != "Unused" else "Free",
        "CompositionStatus": {
            "Reserved": False,
            "CompositionState": state,
            "SharingCapable": False,
            "MaxCompositions": 1,
            "NumberOfCompositions": 1 if host else 0,
        },
        "Processors": [link(f"{BLOCKS}/{block_id}/Processors/GPU0")],
        "Links": {
            "ComputerSystems": [link(f"{ROOT}/Systems/{host}")] if host else [],
            "Chassis": [link(f"{ROOT}/Chassis/{enclosure_id(block.zone)}")],
            "Zones": [link(f"{ZONES}/{block.zone}")],
        },
    }


def _system_block(v: View, host_id: str) -> dict[str, Any]:
    bid = system_block_id(host_id)
    return {
        "@odata.id": f"{BLOCKS}/{bid}",
        "@odata.type": odata_type("ResourceBlock"),
        "Id": bid,
        "Name": f"Expandable system {host_id}",
        "ResourceBlockType": ["ComputerSystem"],
        "Status": _ok(),
        "Pool": "Active",
        "CompositionStatus": {
            "Reserved": False,
            "CompositionState": "Composed",
            "SharingCapable": False,
            "MaxCompositions": 1,
            "NumberOfCompositions": 1,
        },
        "ComputerSystems": [link(f"{ROOT}/Systems/{host_id}")],
        "Links": {
            "ComputerSystems": [link(f"{ROOT}/Systems/{host_id}")],
            "Chassis": [link(f"{ROOT}/Chassis/{host_id}")],
            "Zones": [link(f"{ZONES}/{z}") for z in v.topology.zones_of_host(host_id)],
        },
    }


def _all_block_ids(v: View) -> list[str]:
    return [*v.topology.blocks, *(system_block_id(h) for h in v.topology.hosts)]


def _zone(v: View, zone_id: str) -> dict[str, Any]:
    zone = v.topology.zones[zone_id]
    members = [*zone.blocks, *(system_block_id(h) for h in zone.hosts)]
    return {
        "@odata.id": f"{ZONES}/{zone_id}",
        "@odata.type": odata_type("Zone"),
        "Id": zone_id,
        "Name": f"Resource zone {zone_id}",
        "Description": "GPU blocks and the expandable systems they can be attached to",
        "ZoneType": "ZoneOfResourceBlocks",
        "Status": _ok(),
        "Links": {"ResourceBlocks": [link(f"{BLOCKS}/{b}") for b in members]},
    }


def _composition_service() -> dict[str, Any]:
    return {
        "@odata.id": COMP,
        "@odata.type": odata_type("CompositionService"),
        "Id": "CompositionService",
        "Name": "Composition Service",
        "Status": _ok(),
        "ServiceEnabled": True,
        "AllowOverprovisioning": False,
        "AllowZoneAffinity": True,
        "ResourceBlocks": link(BLOCKS),
        "ResourceZones": link(ZONES),
        "FreePool": link(f"{COMP}/FreePool"),
        "ActivePool": link(f"{COMP}/ActivePool"),
    }


# ---- chassis, managers, accounts, sessions, tasks -----------------------------------------


def _host_chassis(host_id: str) -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/Chassis/{host_id}",
        "@odata.type": odata_type("Chassis"),
        "Id": host_id,
        "Name": f"Chassis of {host_id}",
        "ChassisType": "RackMount",
        "Status": _ok(),
        "Links": {
            "ComputerSystems": [link(f"{ROOT}/Systems/{host_id}")],
            "ManagedBy": [link(f"{ROOT}/Managers/{MANAGER_ID}")],
            "ResourceBlocks": [link(f"{BLOCKS}/{system_block_id(host_id)}")],
        },
    }


def _enclosure(v: View, zone_id: str) -> dict[str, Any]:
    cid = enclosure_id(zone_id)
    return {
        "@odata.id": f"{ROOT}/Chassis/{cid}",
        "@odata.type": odata_type("Chassis"),
        "Id": cid,
        "Name": f"GPU enclosure of {zone_id}",
        "ChassisType": "Enclosure",
        "Status": _ok(),
        "Links": {
            "ManagedBy": [link(f"{ROOT}/Managers/{MANAGER_ID}")],
            "ResourceBlocks": [link(f"{BLOCKS}/{b}") for b in v.topology.zones[zone_id].blocks],
        },
    }


def _chassis_ids(v: View) -> list[str]:
    return [*v.topology.hosts, *(enclosure_id(z) for z in v.topology.zones)]


def _manager(v: View) -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/Managers/{MANAGER_ID}",
        "@odata.type": odata_type("Manager"),
        "Id": MANAGER_ID,
        "Name": "Emulated fabric manager",
        "ManagerType": "Service",
        "Status": _ok(),
        "Links": {
            "ManagerForServers": [link(f"{ROOT}/Systems/{h}") for h in v.topology.hosts],
            "ManagerForChassis": [link(f"{ROOT}/Chassis/{c}") for c in _chassis_ids(v)],
        },
    }


def _session_service() -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/SessionService",
        "@odata.type": odata_type("SessionService"),
        "Id": "SessionService",
        "Name": "Session Service",
        "Status": _ok(),
        "ServiceEnabled": True,
        "SessionTimeout": 1800,
        "Sessions": link(f"{ROOT}/SessionService/Sessions"),
    }


def session(s: SessionInfo) -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/SessionService/Sessions/{s.id}",
        "@odata.type": odata_type("Session"),
        "Id": s.id,
        "Name": "User session",
        "UserName": s.user,
        "Password": None,
        "CreatedTime": s.created,
        "SessionType": "Redfish",
    }


def _account_service() -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/AccountService",
        "@odata.type": odata_type("AccountService"),
        "Id": "AccountService",
        "Name": "Account Service",
        "Status": _ok(),
        "ServiceEnabled": True,
        "Accounts": link(f"{ROOT}/AccountService/Accounts"),
        "Roles": link(f"{ROOT}/AccountService/Roles"),
    }


def _account(v: View) -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/AccountService/Accounts/1",
        "@odata.type": odata_type("ManagerAccount"),
        "Id": "1",
        "Name": "User account",
        "UserName": v.user,
        "Password": None,
        "RoleId": "Administrator",
        "Enabled": True,
        "Locked": False,
        "AccountTypes": ["Redfish"],
        "Links": {"Role": link(f"{ROOT}/AccountService/Roles/Administrator")},
    }


def _role() -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/AccountService/Roles/Administrator",
        "@odata.type": odata_type("Role"),
        "Id": "Administrator",
        "Name": "Administrator role",
        "RoleId": "Administrator",
        "IsPredefined": True,
        "AssignedPrivileges": [
            "Login",
            "ConfigureManager",
            "ConfigureUsers",
            "ConfigureSelf",
            "ConfigureComponents",
        ],
    }


def _task_service() -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/TaskService",
        "@odata.type": odata_type("TaskService"),
        "Id": "TaskService",
        "Name": "Task Service",
        "Status": _ok(),
        "ServiceEnabled": True,
        "CompletedTaskOverWritePolicy": "Oldest",
        "LifeCycleEventOnTaskStateChange": False,
        "Tasks": link(f"{ROOT}/TaskService/Tasks"),
    }


# ---- routing -----------------------------------------------------------------------------

Renderer = Callable[[View, re.Match[str]], dict[str, Any] | None]
_ROUTES: list[tuple[re.Pattern[str], Renderer]] = []


def _route(pattern: str) -> Callable[[Renderer], Renderer]:
    def deco(fn: Renderer) -> Renderer:
        _ROUTES.append((re.compile(f"^{ROOT}{pattern}$"), fn))
        return fn

    return deco


@_route("/?")
def _r_root(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return service_root(v)


@_route("/Systems")
def _r_systems(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "ComputerSystemCollection",
        f"{ROOT}/Systems",
        "Computer System Collection",
        [f"{ROOT}/Systems/{h}" for h in v.topology.hosts],
    )


@_route("/Systems/([^/]+)")
def _r_system(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _system(v, m[1]) if m[1] in v.topology.hosts else None


@_route("/Systems/([^/]+)/(AddResourceBlock|RemoveResourceBlock)ActionInfo")
def _r_action_info(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    if m[1] not in v.topology.hosts:
        return None
    return _action_info(m[1], f"ComputerSystem.{m[2]}")


@_route("/Systems/([^/]+)/Processors")
def _r_processors(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    if m[1] not in v.topology.hosts:
        return None
    base = f"{ROOT}/Systems/{m[1]}/Processors"
    members = [f"{base}/CPU0", *(f"{base}/{b}" for b in v.comp.blocks_of(m[1]))]
    return collection("ProcessorCollection", base, "Processor Collection", members)


@_route("/Systems/([^/]+)/Processors/([^/]+)")
def _r_processor(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    host, pid = m[1], m[2]
    if host not in v.topology.hosts:
        return None
    if pid == "CPU0":
        return _cpu(host)
    if v.comp.attached.get(pid) == host:
        return _gpu(v.topology.blocks[pid], f"{ROOT}/Systems/{host}/Processors/{pid}", pid)
    return None


@_route("/CompositionService")
def _r_comp(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _composition_service()


@_route("/CompositionService/ResourceBlocks")
def _r_blocks(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "ResourceBlockCollection",
        BLOCKS,
        "Resource Block Collection",
        [f"{BLOCKS}/{b}" for b in _all_block_ids(v)],
    )


@_route("/CompositionService/(FreePool|ActivePool)")
def _r_pool(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    free = [b for b in v.topology.blocks if v.comp.state_of(b) == "Unused"]
    members = free if m[1] == "FreePool" else [b for b in _all_block_ids(v) if b not in free]
    name = "Free Pool" if m[1] == "FreePool" else "Active Pool"
    return collection(
        "ResourceBlockCollection", f"{COMP}/{m[1]}", name, [f"{BLOCKS}/{b}" for b in members]
    )


@_route("/CompositionService/ResourceBlocks/([^/]+)")
def _r_block(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    if m[1] in v.topology.blocks:
        return _gpu_block(v, m[1])
    for h in v.topology.hosts:
        if m[1] == system_block_id(h):
            return _system_block(v, h)
    return None


@_route("/CompositionService/ResourceBlocks/([^/]+)/Processors/GPU0")
def _r_block_gpu(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    block = v.topology.blocks.get(m[1])
    if block is None:
        return None
    return _gpu(block, f"{BLOCKS}/{m[1]}/Processors/GPU0", "GPU0")


@_route("/CompositionService/ResourceZones")
def _r_zones(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "ZoneCollection",
        ZONES,
        "Resource Zone Collection",
        [f"{ZONES}/{z}" for z in v.topology.zones],
    )


@_route("/CompositionService/ResourceZones/([^/]+)")
def _r_zone(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _zone(v, m[1]) if m[1] in v.topology.zones else None


@_route("/Chassis")
def _r_chassis_coll(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "ChassisCollection",
        f"{ROOT}/Chassis",
        "Chassis Collection",
        [f"{ROOT}/Chassis/{c}" for c in _chassis_ids(v)],
    )


@_route("/Chassis/([^/]+)")
def _r_chassis(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    if m[1] in v.topology.hosts:
        return _host_chassis(m[1])
    for z in v.topology.zones:
        if m[1] == enclosure_id(z):
            return _enclosure(v, z)
    return None


@_route("/Managers")
def _r_managers(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "ManagerCollection",
        f"{ROOT}/Managers",
        "Manager Collection",
        [f"{ROOT}/Managers/{MANAGER_ID}"],
    )


@_route(f"/Managers/{MANAGER_ID}")
def _r_manager(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _manager(v)


@_route("/SessionService")
def _r_session_service(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _session_service()


@_route("/SessionService/Sessions")
def _r_sessions(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "SessionCollection",
        f"{ROOT}/SessionService/Sessions",
        "Session Collection",
        [f"{ROOT}/SessionService/Sessions/{s}" for s in v.sessions],
    )


@_route("/SessionService/Sessions/([^/]+)")
def _r_session(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    s = v.sessions.get(m[1])
    return session(s) if s else None


@_route("/AccountService")
def _r_account_service(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _account_service()


@_route("/AccountService/Accounts")
def _r_accounts(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "ManagerAccountCollection",
        f"{ROOT}/AccountService/Accounts",
        "Accounts Collection",
        [f"{ROOT}/AccountService/Accounts/1"],
    )


@_route("/AccountService/Accounts/1")
def _r_account(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _account(v)


@_route("/AccountService/Roles")
def _r_roles(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "RoleCollection",
        f"{ROOT}/AccountService/Roles",
        "Roles Collection",
        [f"{ROOT}/AccountService/Roles/Administrator"],
    )


@_route("/AccountService/Roles/Administrator")
def _r_role(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _role()


@_route("/TaskService")
def _r_task_service(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return _task_service()


@_route("/TaskService/Tasks")
def _r_tasks(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return collection(
        "TaskCollection",
        f"{ROOT}/TaskService/Tasks",
        "Task Collection",
        [f"{ROOT}/TaskService/Tasks/{t}" for t in v.tasks],
    )


@_route("/TaskService/Tasks/([^/]+)")
def _r_task(v: View, m: re.Match[str]) -> dict[str, Any] | None:
    return v.tasks.get(m[1])


def render(v: View, path: str) -> dict[str, Any] | None:
    """The resource at ``path`` (no query string), or None."""
    if path != f"{ROOT}/":
        path = path.rstrip("/")
    for pattern, fn in _ROUTES:
        m = pattern.match(path)
        if m:
            return fn(v, m)
    return None
