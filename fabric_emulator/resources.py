"""Redfish payloads, rendered from the topology and the composition (pure functions).

``render(view, path)`` answers a GET: the resource's JSON, or None when there is none.
Every link is derived from the same state, so both ends of a link always agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

from fabric_emulator.query import MAX_LEVELS
from fabric_emulator.state import SYSTEM_BLOCK_PREFIX, Composition, system_block_id
from fabric_emulator.topology import Block, Topology

ROOT = "/redfish/v1"
COMP = f"{ROOT}/CompositionService"
BLOCKS = f"{COMP}/ResourceBlocks"
ZONES = f"{COMP}/ResourceZones"
SYSTEMS = f"{ROOT}/Systems"
CHASSIS = f"{ROOT}/Chassis"
MANAGER_ID = "FabricManager"
MANAGER = f"{ROOT}/Managers/{MANAGER_ID}"
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


def _under(base: str, ids: Iterable[str]) -> list[str]:
    return [f"{base}/{i}" for i in ids]


def links(base: str, ids: Iterable[str]) -> list[dict[str, str]]:
    """Links to the members ``ids`` of the collection at ``base``."""
    return [link(uri) for uri in _under(base, ids)]


def _ok() -> dict[str, str]:
    return {"State": "Enabled", "Health": "OK"}


def _resource(kind: str, uri: str, rid: str, name: str, **props: Any) -> dict[str, Any]:
    """A resource of type ``kind`` at ``uri``: the properties every one has, then ``props``."""
    return {"@odata.id": uri, "@odata.type": odata_type(kind), "Id": rid, "Name": name, **props}


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


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A login session as its Session resource shows it (never its token)."""

    id: str
    user: str
    created: str


@dataclass(frozen=True)
class ReadView:
    """What a GET sees: fixed topology, current composition, sessions and tasks."""

    topology: Topology
    comp: Composition
    sessions: dict[str, SessionInfo]
    tasks: dict[str, dict[str, Any]]  # task id -> rendered Task
    user: str

    @cached_property
    def _attached(self) -> dict[str, list[str]]:
        by_host: dict[str, list[str]] = {}
        for block, host in sorted(self.comp.attached.items()):
            by_host.setdefault(host, []).append(block)
        return by_host

    def blocks_of(self, host_id: str) -> list[str]:
        """The blocks attached to a host, sorted: one pass over the composition per view,
        however many systems one request renders ($expand)."""
        return self._attached.get(host_id, [])


# ---- service root and protocol documents -------------------------------------------------


def service_root(v: ReadView) -> dict[str, Any]:
    return _resource(
        "ServiceRoot",
        f"{ROOT}/",
        "RootService",
        "Composable DRA fabric emulator",
        RedfishVersion="1.21.0",
        UUID=SERVICE_UUID,
        Vendor="composable-dra",
        Product="Redfish fabric emulator",
        ProtocolFeaturesSupported={
            "ExpandQuery": {
                "ExpandAll": True,
                "Levels": True,
                "MaxLevels": MAX_LEVELS,
                "Links": True,
                "NoLinks": True,
            },
            "TopSkipQuery": True,
            "SelectQuery": False,
            "FilterQuery": False,
            "OnlyMemberQuery": False,
            "ExcerptQuery": False,
        },
        Systems=link(SYSTEMS),
        Chassis=link(CHASSIS),
        Managers=link(f"{ROOT}/Managers"),
        SessionService=link(f"{ROOT}/SessionService"),
        AccountService=link(f"{ROOT}/AccountService"),
        CompositionService=link(COMP),
        Tasks=link(f"{ROOT}/TaskService"),
        Links={"Sessions": link(f"{ROOT}/SessionService/Sessions")},
    )


def odata_document() -> dict[str, Any]:
    names = [
        ("Service", f"{ROOT}/"),
        ("Systems", SYSTEMS),
        ("Chassis", CHASSIS),
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


def _system(v: ReadView, host_id: str) -> dict[str, Any]:
    host = v.topology.hosts[host_id]
    uri = f"{SYSTEMS}/{host_id}"
    blocks = [system_block_id(host_id), *v.blocks_of(host_id)]
    return _resource(
        "ComputerSystem",
        uri,
        host_id,
        host.name,
        SystemType="Physical",
        Composition={"UseCases": ["ExpandableSystem"]},
        UUID=host.uuid,
        HostName=host_id,
        PowerState="On",
        Status=_ok(),
        ProcessorSummary={"Count": 1 + len(v.blocks_of(host_id))},
        Processors=link(f"{uri}/Processors"),
        Links={
            "Chassis": links(CHASSIS, [host_id]),
            "ManagedBy": [link(MANAGER)],
            "ResourceBlocks": links(BLOCKS, blocks),
        },
        Actions={
            "#ComputerSystem.AddResourceBlock": {
                "target": f"{uri}/Actions/ComputerSystem.AddResourceBlock",
                "@Redfish.ActionInfo": f"{uri}/AddResourceBlockActionInfo",
            },
            "#ComputerSystem.RemoveResourceBlock": {
                "target": f"{uri}/Actions/ComputerSystem.RemoveResourceBlock",
                "@Redfish.ActionInfo": f"{uri}/RemoveResourceBlockActionInfo",
            },
        },
    )


def _action_info(host_id: str, action: str) -> dict[str, Any]:
    short = action.split(".")[1]
    return _resource(
        "ActionInfo",
        f"{SYSTEMS}/{host_id}/{short}ActionInfo",
        f"{short}ActionInfo",
        f"{short} action parameters",
        Parameters=[
            {
                "Name": "ResourceBlock",
                "Required": True,
                "DataType": "Object",
                "ObjectDataType": "#ResourceBlock.ResourceBlock",
            },
            {"Name": "ResourceBlockETag", "Required": False, "DataType": "String"},
            {"Name": "ComputerSystemETag", "Required": False, "DataType": "String"},
        ],
    )


def _cpu(host_id: str) -> dict[str, Any]:
    return _resource(
        "Processor",
        f"{SYSTEMS}/{host_id}/Processors/CPU0",
        "CPU0",
        "Host CPU",
        ProcessorType="CPU",
        Manufacturer="Emulated",
        Model="Emulated host CPU",
        TotalCores=32,
        TotalThreads=64,
        Status=_ok(),
        Links={"Chassis": link(f"{CHASSIS}/{host_id}")},
    )


def _block_status(v: ReadView, block_id: str) -> dict[str, str]:
    return dict(v.comp.status.get(block_id) or _ok())


def _gpu(block: Block, uri: str, pid: str, status: dict[str, str]) -> dict[str, Any]:
    return _resource(
        "Processor",
        uri,
        pid,
        f"GPU of resource block {block.id}",
        ProcessorType="GPU",
        Manufacturer=block.manufacturer,
        Model=block.model,
        UUID=block.redfish_uuid,
        ProcessorMemory=[
            {
                "IntegratedMemory": True,
                "MemoryType": block.memory_type,
                "CapacityMiB": block.memory_mib,
            }
        ],
        Status=status,
        Links={"Chassis": link(f"{CHASSIS}/{enclosure_id(block.zone)}")},
    )


# ---- composition service -----------------------------------------------------------------


def _composition_status(state: str, compositions: int) -> dict[str, Any]:
    """A block that one system at a time can use, never reserved."""
    return {
        "Reserved": False,
        "CompositionState": state,
        "SharingCapable": False,
        "MaxCompositions": 1,
        "NumberOfCompositions": compositions,
    }


def _gpu_block(v: ReadView, block_id: str) -> dict[str, Any]:
    block = v.topology.blocks[block_id]
    state = v.comp.state_of(block_id)
    host = v.comp.attached.get(block_id)
    return _resource(
        "ResourceBlock",
        f"{BLOCKS}/{block_id}",
        block_id,
        f"GPU block {block_id}",
        Description=f"{block.model} in {block.zone}",
        ResourceBlockType=["Processor"],
        Status=_block_status(v, block_id),
        Pool="Active" if state != "Unused" else "Free",
        CompositionStatus=_composition_status(state, 1 if host else 0),
        Processors=[link(f"{BLOCKS}/{block_id}/Processors/GPU0")],
        Links={
            "ComputerSystems": links(SYSTEMS, [host] if host else []),
            "Chassis": links(CHASSIS, [enclosure_id(block.zone)]),
            "Zones": links(ZONES, [block.zone]),
        },
    )


def _system_block(v: ReadView, host_id: str) -> dict[str, Any]:
    bid = system_block_id(host_id)
    return _resource(
        "ResourceBlock",
        f"{BLOCKS}/{bid}",
        bid,
        f"Expandable system {host_id}",
        ResourceBlockType=["ComputerSystem"],
        Status=_ok(),
        Pool="Active",
        CompositionStatus=_composition_status("Composed", 1),
        ComputerSystems=links(SYSTEMS, [host_id]),
        Links={
            "ComputerSystems": links(SYSTEMS, [host_id]),
            "Chassis": links(CHASSIS, [host_id]),
            "Zones": links(ZONES, v.topology.zones_of_host(host_id)),
        },
    )


def _all_block_ids(v: ReadView) -> list[str]:
    return [*v.topology.blocks, *(system_block_id(h) for h in v.topology.hosts)]


def _zone(v: ReadView, zone_id: str) -> dict[str, Any]:
    zone = v.topology.zones[zone_id]
    members = [*zone.blocks, *(system_block_id(h) for h in zone.hosts)]
    return _resource(
        "Zone",
        f"{ZONES}/{zone_id}",
        zone_id,
        f"Resource zone {zone_id}",
        Description="GPU blocks and the expandable systems they can be attached to",
        ZoneType="ZoneOfResourceBlocks",
        Status=_ok(),
        Links={"ResourceBlocks": links(BLOCKS, members)},
    )


def _service(kind: str, name: str, **props: Any) -> dict[str, Any]:
    """One of the service's singletons (``/redfish/v1/<kind>``), enabled."""
    return _resource(kind, f"{ROOT}/{kind}", kind, name, Status=_ok(), ServiceEnabled=True, **props)


def _composition_service() -> dict[str, Any]:
    return _service(
        "CompositionService",
        "Composition Service",
        AllowOverprovisioning=False,
        AllowZoneAffinity=True,
        ResourceBlocks=link(BLOCKS),
        ResourceZones=link(ZONES),
        FreePool=link(f"{COMP}/FreePool"),
        ActivePool=link(f"{COMP}/ActivePool"),
    )


# ---- chassis, managers, accounts, sessions, tasks -----------------------------------------


def _chassis_resource(
    cid: str, name: str, chassis_type: str, blocks: Iterable[str], systems: Iterable[str] = ()
) -> dict[str, Any]:
    """A Chassis the one manager manages, holding ``blocks`` (and ``systems``)."""
    system_links = {"ComputerSystems": links(SYSTEMS, systems)} if systems else {}
    return _resource(
        "Chassis",
        f"{CHASSIS}/{cid}",
        cid,
        name,
        ChassisType=chassis_type,
        Status=_ok(),
        Links={
            **system_links,
            "ManagedBy": [link(MANAGER)],
            "ResourceBlocks": links(BLOCKS, blocks),
        },
    )


def _host_chassis(host_id: str) -> dict[str, Any]:
    return _chassis_resource(
        host_id, f"Chassis of {host_id}", "RackMount", [system_block_id(host_id)], [host_id]
    )


def _enclosure(v: ReadView, zone_id: str) -> dict[str, Any]:
    return _chassis_resource(
        enclosure_id(zone_id),
        f"GPU enclosure of {zone_id}",
        "Enclosure",
        v.topology.zones[zone_id].blocks,
    )


def _chassis_ids(v: ReadView) -> list[str]:
    return [*v.topology.hosts, *(enclosure_id(z) for z in v.topology.zones)]


def _manager(v: ReadView) -> dict[str, Any]:
    return _resource(
        "Manager",
        MANAGER,
        MANAGER_ID,
        "Emulated fabric manager",
        ManagerType="Service",
        Status=_ok(),
        Links={
            "ManagerForServers": links(SYSTEMS, v.topology.hosts),
            "ManagerForChassis": links(CHASSIS, _chassis_ids(v)),
        },
    )


def _session_service() -> dict[str, Any]:
    return _service(
        "SessionService",
        "Session Service",
        SessionTimeout=1800,
        Sessions=link(f"{ROOT}/SessionService/Sessions"),
    )


def session(s: SessionInfo) -> dict[str, Any]:
    return _resource(
        "Session",
        f"{ROOT}/SessionService/Sessions/{s.id}",
        s.id,
        "User session",
        UserName=s.user,
        Password=None,
        CreatedTime=s.created,
        SessionType="Redfish",
    )


def _account_service() -> dict[str, Any]:
    return _service(
        "AccountService",
        "Account Service",
        Accounts=link(f"{ROOT}/AccountService/Accounts"),
        Roles=link(f"{ROOT}/AccountService/Roles"),
    )


def _account(v: ReadView) -> dict[str, Any]:
    return _resource(
        "ManagerAccount",
        f"{ROOT}/AccountService/Accounts/1",
        "1",
        "User account",
        UserName=v.user,
        Password=None,
        RoleId="Administrator",
        Enabled=True,
        Locked=False,
        AccountTypes=["Redfish"],
        Links={"Role": link(f"{ROOT}/AccountService/Roles/Administrator")},
    )


def _role() -> dict[str, Any]:
    return _resource(
        "Role",
        f"{ROOT}/AccountService/Roles/Administrator",
        "Administrator",
        "Administrator role",
        RoleId="Administrator",
        IsPredefined=True,
        AssignedPrivileges=[
            "Login",
            "ConfigureManager",
            "ConfigureUsers",
            "ConfigureSelf",
            "ConfigureComponents",
        ],
    )


def _task_service() -> dict[str, Any]:
    return _service(
        "TaskService",
        "Task Service",
        CompletedTaskOverWritePolicy="Oldest",
        LifeCycleEventOnTaskStateChange=False,
        Tasks=link(f"{ROOT}/TaskService/Tasks"),
    )


# ---- routing -----------------------------------------------------------------------------

T = TypeVar("T")
Renderer = Callable[[ReadView, re.Match[str]], dict[str, Any] | None]
Members = Callable[[ReadView, re.Match[str]], list[str] | None]


@dataclass(frozen=True)
class Collection:
    """A resource collection at the route's path: its type, its name and its members'
    URIs (None when the resource that owns the collection does not exist)."""

    kind: str
    name: str
    members: Members

    def __call__(self, v: ReadView, m: re.Match[str]) -> dict[str, Any] | None:
        uris = self.members(v, m)
        return None if uris is None else collection(self.kind, m[0], self.name, uris)


def _if_host(v: ReadView, host: str, fn: Callable[[], T]) -> T | None:
    return fn() if host in v.topology.hosts else None


def _processor_ids(v: ReadView, m: re.Match[str]) -> list[str] | None:
    return _if_host(v, m[1], lambda: _under(m[0], ["CPU0", *v.blocks_of(m[1])]))


def _processor(v: ReadView, m: re.Match[str]) -> dict[str, Any] | None:
    host, pid = m[1], m[2]
    if host not in v.topology.hosts:
        return None
    if pid == "CPU0":
        return _cpu(host)
    if v.comp.attached.get(pid) == host:
        return _gpu(v.topology.blocks[pid], m[0], pid, _block_status(v, pid))
    return None


def _pool(v: ReadView, m: re.Match[str]) -> list[str]:
    free = [b for b in v.topology.blocks if v.comp.state_of(b) == "Unused"]
    if m[1] == "FreePool":
        return _under(BLOCKS, free)
    unused = set(free)
    return _under(BLOCKS, (b for b in _all_block_ids(v) if b not in unused))


def _block(v: ReadView, m: re.Match[str]) -> dict[str, Any] | None:
    if m[1] in v.topology.blocks:
        return _gpu_block(v, m[1])
    host = m[1].removeprefix(SYSTEM_BLOCK_PREFIX)
    if m[1] != host and host in v.topology.hosts:
        return _system_block(v, host)
    return None


def _block_gpu(v: ReadView, m: re.Match[str]) -> dict[str, Any] | None:
    block = v.topology.blocks.get(m[1])
    return None if block is None else _gpu(block, m[0], "GPU0", _block_status(v, block.id))


def _chassis(v: ReadView, m: re.Match[str]) -> dict[str, Any] | None:
    if m[1] in v.topology.hosts:
        return _host_chassis(m[1])
    zone = m[1].removeprefix(enclosure_id(""))
    return _enclosure(v, zone) if m[1] != zone and zone in v.topology.zones else None


def _session(v: ReadView, m: re.Match[str]) -> dict[str, Any] | None:
    s = v.sessions.get(m[1])
    return session(s) if s else None


# Path (below ROOT) -> what answers a GET there: a Collection or a renderer.
_TABLE: tuple[tuple[str, Renderer], ...] = (
    ("/?", lambda v, m: service_root(v)),
    (
        "/Systems",
        Collection(
            "ComputerSystemCollection",
            "Computer System Collection",
            lambda v, m: _under(m[0], v.topology.hosts),
        ),
    ),
    ("/Systems/([^/]+)", lambda v, m: _if_host(v, m[1], lambda: _system(v, m[1]))),
    (
        "/Systems/([^/]+)/(AddResourceBlock|RemoveResourceBlock)ActionInfo",
        lambda v, m: _if_host(v, m[1], lambda: _action_info(m[1], f"ComputerSystem.{m[2]}")),
    ),
    (
        "/Systems/([^/]+)/Processors",
        Collection("ProcessorCollection", "Processor Collection", _processor_ids),
    ),
    ("/Systems/([^/]+)/Processors/([^/]+)", _processor),
    ("/CompositionService", lambda v, m: _composition_service()),
    (
        "/CompositionService/ResourceBlocks",
        Collection(
            "ResourceBlockCollection",
            "Resource Block Collection",
            lambda v, m: _under(m[0], _all_block_ids(v)),
        ),
    ),
    (
        "/CompositionService/(FreePool)",
        Collection("ResourceBlockCollection", "Free Pool", _pool),
    ),
    (
        "/CompositionService/(ActivePool)",
        Collection("ResourceBlockCollection", "Active Pool", _pool),
    ),
    ("/CompositionService/ResourceBlocks/([^/]+)", _block),
    ("/CompositionService/ResourceBlocks/([^/]+)/Processors/GPU0", _block_gpu),
    (
        "/CompositionService/ResourceZones",
        Collection(
            "ZoneCollection",
            "Resource Zone Collection",
            lambda v, m: _under(m[0], v.topology.zones),
        ),
    ),
    (
        "/CompositionService/ResourceZones/([^/]+)",
        lambda v, m: _zone(v, m[1]) if m[1] in v.topology.zones else None,
    ),
    (
        "/Chassis",
        Collection(
            "ChassisCollection", "Chassis Collection", lambda v, m: _under(m[0], _chassis_ids(v))
        ),
    ),
    ("/Chassis/([^/]+)", _chassis),
    (
        "/Managers",
        Collection(
            "ManagerCollection", "Manager Collection", lambda v, m: _under(m[0], [MANAGER_ID])
        ),
    ),
    (f"/Managers/{MANAGER_ID}", lambda v, m: _manager(v)),
    ("/SessionService", lambda v, m: _session_service()),
    (
        "/SessionService/Sessions",
        Collection(
            "SessionCollection", "Session Collection", lambda v, m: _under(m[0], v.sessions)
        ),
    ),
    ("/SessionService/Sessions/([^/]+)", _session),
    ("/AccountService", lambda v, m: _account_service()),
    (
        "/AccountService/Accounts",
        Collection(
            "ManagerAccountCollection", "Accounts Collection", lambda v, m: _under(m[0], ["1"])
        ),
    ),
    ("/AccountService/Accounts/1", lambda v, m: _account(v)),
    (
        "/AccountService/Roles",
        Collection(
            "RoleCollection", "Roles Collection", lambda v, m: _under(m[0], ["Administrator"])
        ),
    ),
    ("/AccountService/Roles/Administrator", lambda v, m: _role()),
    ("/TaskService", lambda v, m: _task_service()),
    (
        "/TaskService/Tasks",
        Collection("TaskCollection", "Task Collection", lambda v, m: _under(m[0], v.tasks)),
    ),
    ("/TaskService/Tasks/([^/]+)", lambda v, m: v.tasks.get(m[1])),
)
_ROUTES = [(re.compile(f"^{ROOT}{pattern}$"), fn) for pattern, fn in _TABLE]


def render(v: ReadView, path: str) -> dict[str, Any] | None:
    """The resource at ``path`` (no query string), or None."""
    if path != f"{ROOT}/":
        path = path.rstrip("/")
    for pattern, fn in _ROUTES:
        m = pattern.match(path)
        if m:
            return fn(v, m)
    return None
