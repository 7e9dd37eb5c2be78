"""Randomized attach/detach under injected fabric faults and operator kills.

Starts a local control plane, the fabric emulator (asynchronous tasks), three fake nodes
on the emulator's hosts with the plugin each (its GPUs through the fake NVML over the
host state the emulator shares, testbed/fake_nvml, released before each detach: the
operator awaits the host release, its default), and the operator as its own process. Then
OPERATIONS random operations: create a ComposableResource for a free block and a node
its zone reaches, delete one, or cancel one mid-attach (create it and delete it as soon
as its attach is under way; every attach request takes --attach-latency seconds to reach
the fabric, so a cancelled one is often still on its way); meanwhile the emulator injects
503s, 500s, dropped connections before and after the change, failed tasks and latency,
and the operator is SIGKILLed and restarted at KILLS random moments. At the end faults
stop, everything settles (every fabric task ended), and the emulator's composition is
compared with the resources.

The last line printed is JSON: operations, cancelled, restarts, leaked (a block attached
with no resource, or a resource Online without its attachment), double_attached (a block
named by two live resources, or attached where its resource does not say),
surprise_removals (blocks the fabric removed while their host still held them, as the
emulator saw it: must be 0), settle_s, and the fault counts the emulator reports.

With --backend fsas-fm the operator reaches the same emulator through its Fsas CDI
fabric manager API (OAuth token, synchronous machines/{m}/update) instead of Redfish, and
the same faults hit that API's changes and reads. With --fsas-pick too, the FM behaves as
CoHDI's CI mock of it (it picks the GPU of the model, and lists free GPUs only as counts):
the Fabric says attachBy model, each resource names a pool slot of a model and node with
room left, and the check compares the composition with the GPUs the resources recorded
(status.fabricDeviceID).

Usage: KUBE_BIN_DIR=... python hack/bench/fabric_faults.py [--operations 200] [--kills 5]
    [--backend redfish-composition|fsas-fm] [--fsas-pick]
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from api.v1alpha1 import API_VERSION  # noqa: E402
from composable_dra.fabric.slots import is_slot, slot_name  # noqa: E402
from composable_dra.k8s.kube import JSON, Kube, path  # noqa: E402
from fabric_emulator.fsas.config import FsasConfig, process_args  # noqa: E402
from fabric_emulator.testing import EmulatorProcess  # noqa: E402
from fabric_emulator.topology import host_uuid  # noqa: E402
from testbed import ControlPlane, fake_nvml  # noqa: E402
from testbed.controlplane import find_binaries  # noqa: E402
from testbed.crds import install_crds  # noqa: E402
from testbed.nodes import create_node  # noqa: E402
from testbed.plugin_process import PluginProcess  # noqa: E402
from testbed.process import ComponentProcess  # noqa: E402
from testbed.wait import wait_for  # noqa: E402

RESOURCES = path(API_VERSION, "composableresources")
FABRIC = "bench"
# Per backend, the paths faults hit: the attach and detach calls, every call, the reads of
# one device, and the attach request (method, path) that --attach-latency slows.
PATHS: dict[str, dict[str, str]] = {
    "redfish-composition": {
        "changes": "Actions/ComputerSystem",
        "all": "/redfish/v1/",
        "device": "ResourceBlocks/",
        "attach_method": "POST",
        "attach": "AddResourceBlock",
    },
    "fsas-fm": {
        "changes": "machines/[^/]+/update$",
        "all": "/fabric_manager/",
        "device": "/resources/",
        "attach_method": "PATCH",
        "attach": "/update$",
    },
}
FSAS = FsasConfig()


def faults(seed: int, paths: dict[str, str] = PATHS["redfish-composition"]) -> list[dict[str, Any]]:
    changes = paths["changes"]
    rules: list[dict[str, Any]] = [
        {"kind": "status503", "path": changes, "probability": 0.06, "retry_after": 1},
        {"kind": "status500", "path": changes, "probability": 0.06},
        {"kind": "drop_before", "path": changes, "probability": 0.05},
        {"kind": "drop_after", "path": changes, "probability": 0.05},
        {"kind": "task_failure", "path": changes, "probability": 0.06},
        {"kind": "latency", "path": paths["all"], "probability": 0.05, "latency": 0.3},
        {
            "kind": "status503",
            "path": paths["device"],
            "method": "GET",
            "probability": 0.01,
            "retry_after": 1,
        },
    ]
    return [{**r, "seed": seed + i} for i, r in enumerate(rules)]


def device_of(r: JSON) -> str:
    """The fabric's device of a resource: the one the FM picked for a slot."""
    device = str(r["spec"]["deviceID"])
    return str((r.get("status") or {}).get("fabricDeviceID") or "") if is_slot(device) else device


def fsas_settings(blocks: dict[str, Any], pick: bool) -> JSON:
    settings: JSON = {"tenantUUID": FSAS.tenant, "realm": FSAS.realm}
    if pick:
        settings |= {"attachBy": "model", "models": sorted({b["model"] for b in blocks.values()})}
    return settings


def room(blocks: dict[str, Any], resources: list[JSON], reach: dict[str, list[str]]) -> list[Any]:
    """(a free block standing for its model, a node it reaches) where the FM has a GPU of
    that model left for that node's host, counting every resource without a recorded
    pick as holding one anywhere (so that an attach does not fail for want of a GPU)."""
    unpicked = sum(1 for r in resources if not device_of(r))
    out = []
    for node in sorted({n for ns in reach.values() for n in ns}):
        for model in sorted({b["model"] for b in blocks.values()}):
            free = [
                b
                for b, s in blocks.items()
                if s["state"] == "Unused" and s["model"] == model and node in reach[s["zone"]]
            ]
            if len(free) > unpicked:
                out.append((min(free), node))
    return out


def phase(r: JSON) -> str:
    return str((r.get("status") or {}).get("phase") or "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=200)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=4, help="changes under way at once")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--cancel", type=float, default=0.2, help="share of creates cancelled mid-attach"
    )
    parser.add_argument(
        "--attach-latency", type=float, default=1.0, help="seconds added to each attach request"
    )
    parser.add_argument("--backend", choices=sorted(PATHS), default="redfish-composition")
    parser.add_argument(
        "--fsas-pick",
        action="store_true",
        help="fsas-fm: the FM picks the GPU and lists free ones as counts (CoHDI's CI mock)",
    )
    return parser.parse_args(argv)


def fault_rules(args: argparse.Namespace, paths: dict[str, str]) -> list[dict[str, Any]]:
    """The faults, and the latency of every attach request: a cancelled attach is then
    still on its way when its resource is deleted."""
    rules = faults(args.seed, paths)
    if args.attach_latency <= 0:
        return rules
    latency = {
        "kind": "latency",
        "method": paths["attach_method"],
        "path": paths["attach"],
        "latency": args.attach_latency,
    }
    return [*rules, latency]


def create_fabric(kube: Kube, emulator: EmulatorProcess, backend: str, pick: bool) -> None:
    """The Fabric on the emulator, with its credentials Secret (Redfish and Fsas FM)."""
    kube.create(path("v1", "namespaces"), {"metadata": {"name": "composable-dra"}})
    creds = {
        "username": "admin",
        "password": "admin",
        "client_id": FSAS.client_id,
        "client_secret": FSAS.client_secret,
    }
    kube.create(
        path("v1", "secrets", namespace="composable-dra"),
        {
            "metadata": {"name": FABRIC},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in creds.items()},
        },
    )
    fsas = backend == "fsas-fm"
    settings = {"fsas": fsas_settings(emulator.state()["blocks"], pick)} if fsas else {}
    kube.create(
        path(API_VERSION, "fabrics"),
        {
            "apiVersion": API_VERSION,
            "kind": "Fabric",
            "metadata": {"name": FABRIC},
            "spec": {
                "backend": backend,
                **settings,
                "endpoint": emulator.url,
                "credentialsSecret": {"name": FABRIC, "namespace": "composable-dra"},
                "operationTimeoutSeconds": 120,
                "orphanPolicy": "Ignore",
            },
        },
    )


def start_plugins(
    kube: Kube, kubeconfig: Path, work: Path, emulator: EmulatorProcess
) -> list[PluginProcess]:
    """Three fake nodes on the emulator's hosts, each with the plugin: its GPUs through the
    fake NVML over the host state the emulator shares, released before each detach."""
    assert emulator.host_state_dir is not None
    plugins = []
    for host in ("node-1", "node-2", "node-3"):
        create_node(kube.api, host, system_uuid=host_uuid(host))
        plugin = PluginProcess(
            node=host,
            kubeconfig=kubeconfig,
            plugins_registry_dir=work / host / "registry",
            plugins_dir=work / host / "p",
            cdi_dir=work / host / "cdi",
            workdir=work / host / "plugin",
            extra_args=fake_nvml.plugin_args(1),
            env=fake_nvml.env(emulator.host_state_dir, host),
        )
        plugin.start()
        plugins.append(plugin)
    return plugins


def start_operator(kubeconfig: Path, work: Path) -> ComponentProcess:
    args = [
        f"--kubeconfig={kubeconfig}",
        "--leader-elect-namespace=kube-system",
        "--metrics-port=0",
        "--online-poll-seconds=3",
        "--await-host-release",
    ]
    return ComponentProcess("operator", args, work / "operator").start()


@dataclass
class Operations:
    """The random operations on one fabric, and what they did."""

    args: argparse.Namespace
    kube: Kube
    emulator: EmulatorProcess
    operator: ComponentProcess
    rng: random.Random
    pick: bool
    created: int = 0
    cancelled: int = 0
    restarts: int = 0

    def __post_init__(self) -> None:
        self.blocks0 = self.emulator.state()["blocks"]
        self.zones = {b: s["zone"] for b, s in self.blocks0.items()}
        self.reach = {"zone-1": ["node-1", "node-2"], "zone-2": ["node-2", "node-3"]}

    def resources(self) -> list[JSON]:
        items: list[JSON] = self.kube.get(RESOURCES)["items"]
        return items

    def settled_enough(self) -> bool:
        busy = [
            r
            for r in self.resources()
            if r["metadata"].get("deletionTimestamp") or phase(r) not in ("Online", "Failed")
        ]
        return len(busy) < int(self.args.in_flight)

    def run(self) -> None:
        """Every operation, with the operator killed and restarted at random ones."""
        kills = set(self.rng.sample(range(10, self.args.operations), self.args.kills))
        for i in range(self.args.operations):
            wait_for(self.settled_enough, 300, "room for another change", interval=0.2)
            live = self.one()
            if i in kills:
                self.operator.kill()
                self.operator.start()
                self.restarts += 1
            print(f"op {i + 1}/{self.args.operations}: {live} resources", file=sys.stderr)

    def one(self) -> int:
        """One operation: create (and perhaps cancel) a resource, or delete one; returns
        how many resources were live before it."""
        everything = self.resources()
        live = [r for r in everything if not r["metadata"].get("deletionTimestamp")]
        named = {r["spec"]["deviceID"] for r in live}
        if self.pick:
            free = room(self.emulator.state()["blocks"], everything, self.reach)
        else:
            free = [
                (b, self.rng.choice(self.reach[self.zones[b]]))
                for b in self.zones
                if b not in named
            ]
        deletable = [r for r in live if phase(r) in ("Online", "Failed")]
        if free and (self.rng.random() < 0.55 or not deletable):
            block, node = self.rng.choice(free)
            name, block = self.create(block, node)
            if self.rng.random() < self.args.cancel:
                self.cancel(name, block)
        elif deletable:
            victim = self.rng.choice(deletable)
            self.kube.delete(path(API_VERSION, "composableresources", victim["metadata"]["name"]))
        return len(live)

    def create(self, block: str, node: str) -> tuple[str, str]:
        """A resource for ``block`` (or, when the FM picks, a slot of its model) on ``node``;
        its name and the device it names."""
        self.created += 1
        spec = {"fabric": FABRIC, "deviceID": block, "targetNode": node}
        if self.pick:  # a slot of the model: the FM picks the GPU
            model = self.blocks0[block]["model"]
            block = slot_name(self.zones[block], model, self.created)
            spec = {**spec, "deviceID": block, "model": model}
        name = f"r{self.created}-{block}"
        body = {
            "apiVersion": API_VERSION,
            "kind": "ComposableResource",
            "metadata": {"name": name},
            "spec": spec,
        }
        self.kube.create(RESOURCES, body)
        return name, block

    def cancel(self, name: str, block: str) -> None:
        """Delete the resource ``name`` as soon as its attach is under way."""
        r_path = path(API_VERSION, "composableresources", name)

        def under_way() -> bool:
            r = self.kube.get_or_none(r_path) or {}
            if self.pick or phase(r) not in ("", "Online"):
                return phase(r) not in ("", "Online")
            return bool(self.emulator.state()["blocks"][block]["state"] != "Unused")

        # An operator killed meanwhile may take a while to come back.
        wait_for(under_way, 120, f"the attach of {name} to start", interval=0.05)
        self.kube.delete(r_path)
        self.cancelled += 1

    def settle(self) -> None:
        """Until every fabric task has ended and every resource is Online; a resource that
        failed (under faults, or on a block someone else holds) is deleted as a user would."""

        def settled() -> bool:
            items = self.resources()
            for r in items:
                if phase(r) == "Failed" and not r["metadata"].get("deletionTimestamp"):
                    self.kube.delete(
                        path(API_VERSION, "composableresources", r["metadata"]["name"])
                    )
            tasks = self.emulator.state()["tasks"].values()
            return all(t != "Running" for t in tasks) and all(
                phase(r) == "Online" and not r["metadata"].get("deletionTimestamp") for r in items
            )

        wait_for(
            settled,
            600,
            "every resource to settle",
            interval=0.5,
            describe=lambda: str(
                [
                    (r["metadata"]["name"], phase(r))
                    for r in self.resources()
                    if phase(r) != "Online"
                ]
            ),
        )


def check(blocks: dict[str, Any], final: list[JSON]) -> dict[str, list[str]]:
    """The emulator's composition against the resources: blocks attached with no resource
    or resources Online without their attachment (leaked), blocks left mid-change (stuck),
    blocks named twice or attached where their resource does not say (double)."""
    attached = {b: s["system"] for b, s in blocks.items() if s["state"] == "Composed"}
    stuck = [b for b, s in blocks.items() if s["state"] not in ("Composed", "Unused")]
    by_device: dict[str, list[JSON]] = {}
    for r in final:
        by_device.setdefault(device_of(r), []).append(r)
    leaked = [b for b in attached if b not in by_device]
    leaked += [r["metadata"]["name"] for r in final if device_of(r) not in attached]
    double = [b for b, rs in by_device.items() if len(rs) > 1]
    double += [
        b
        for b, host in attached.items()
        if b in by_device and by_device[b][0]["spec"]["targetNode"] != host
    ]
    return {"leaked": leaked, "stuck": stuck, "double": double, "attached": list(attached)}


def bench(args: argparse.Namespace, work: Path, procs: list[Any]) -> dict[str, Any]:
    """Start the control plane and the suite, run the operations, settle, check."""
    paths = PATHS[args.backend]
    fsas = args.backend == "fsas-fm"
    pick = fsas and args.fsas_pick
    fsas_config = FsasConfig(attach_by_model=True, list_resources=False) if pick else FSAS
    if pick:  # no resource reads on such an FM: the machine reads take their faults
        paths = {**paths, "device": "/machines/[^/]+$"}
    rng = random.Random(args.seed)
    with ControlPlane(find_binaries(), workdir=work / "cp") as cp:
        kube = cp.kube()
        install_crds(kube)
        emu_dir = work / "emulator"
        emulator = EmulatorProcess(
            async_polls=1,
            task_seconds=5,
            workdir=emu_dir,
            extra_args=process_args(emu_dir, fsas_config) if fsas else (),
            host_state_dir=work / "hosts",
        )
        emulator.start()
        procs.append(emulator)
        create_fabric(kube, emulator, args.backend, pick)
        procs.extend(start_plugins(kube, cp.kubeconfig, work, emulator))
        operator = start_operator(cp.kubeconfig, work)
        procs.append(operator)

        ops = Operations(args, kube, emulator, operator, rng, pick)
        emulator.set_faults(fault_rules(args, paths))
        started = time.monotonic()
        ops.run()
        ops_s = time.monotonic() - started

        fault_state = emulator.faults()
        emulator.clear_faults()
        t0 = time.monotonic()
        ops.settle()
        settle_s = time.monotonic() - t0

        final = ops.resources()
        found = check(emulator.state()["blocks"], final)
        surprises = emulator.surprise_removals()
        for p in reversed(procs):
            p.stop()
        procs.clear()
    leaked, stuck, double = found["leaked"], found["stuck"], found["double"]
    return {
        "backend": args.backend,
        "operations": args.operations,
        "cancelled": ops.cancelled,
        "restarts": ops.restarts,
        "leaked": len(leaked) + len(stuck),
        "double_attached": len(double),
        # Blocks removed while their host still held them (must be 0; host_bus.py).
        "surprise_removals": len(surprises),
        "surprise_items": sorted(s["block"] for s in surprises),
        "leaked_items": sorted(leaked + stuck),
        "double_items": sorted(double),
        "resources_online": len(final),
        "blocks_attached": len(found["attached"]),
        "operations_s": round(ops_s, 1),
        "settle_s": round(settle_s, 1),
        "faults_fired": {
            f"{r['kind']}:{r.get('method') or '*'}": r.get("fired", 0) for r in fault_state
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="cdra-faults-", dir="/tmp"))
    keep = False  # the logs stay when the result is not clean
    procs: list[Any] = []
    try:
        result = bench(args, work, procs)
        clean = not (result["leaked"] or result["double_attached"] or result["surprise_removals"])
        if not clean:
            keep = True
            print(f"logs kept in {work}", file=sys.stderr)
        print(json.dumps(result), flush=True)
        return 0 if clean else 1
    finally:
        for p in reversed(procs):
            p.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
