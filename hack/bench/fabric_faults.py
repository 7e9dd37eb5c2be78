"""Randomized attach/detach under injected fabric faults and operator kills.

Starts a local control plane, the fabric emulator (asynchronous tasks), three fake nodes
on the emulator's hosts with the plugin (redfish source) each, and the operator as its
own process. Then OPERATIONS random operations: create a ComposableResource for a free
block and a node its zone reaches, delete one, or cancel one mid-attach (create it and
delete it as soon as its attach is under way; every attach request takes
--attach-latency seconds to reach the fabric, so a cancelled one is often still on its
way); meanwhile the emulator injects 503s, 500s, dropped connections before and after
the change, failed tasks and latency, and the operator is SIGKILLed and restarted at
KILLS random moments. At the end faults stop, everything settles (every fabric task
ended), and the emulator's composition is compared with the resources.

The last line printed is JSON: operations, cancelled, restarts, leaked (a block attached
with no resource, or a resource Online without its attachment), double_attached (a block
named by two live resources, or attached where its resource does not say), settle_s, and
the fault counts the emulator reports.

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
from hack.localcluster import ControlPlane  # noqa: E402
from hack.localcluster.controlplane import find_binaries  # noqa: E402
from hack.localcluster.crds import install_crds  # noqa: E402
from hack.localcluster.nodes import create_node  # noqa: E402
from hack.localcluster.plugin_process import PluginProcess, redfish_source_args  # noqa: E402
from hack.localcluster.process import ComponentProcess  # noqa: E402
from hack.localcluster.wait import wait_for  # noqa: E402

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


def main() -> int:
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
    args = parser.parse_args()
    paths = PATHS[args.backend]
    fsas = args.backend == "fsas-fm"
    pick = fsas and args.fsas_pick
    fsas_config = FsasConfig(attach_by_model=True, list_resources=False) if pick else FSAS
    if pick:  # no resource reads on such an FM: the machine reads take their faults
        paths = {**paths, "device": "/machines/[^/]+$"}
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="cdra-faults-", dir="/tmp"))
    keep = False  # the logs stay when the result is not clean
    procs: list[Any] = []
    try:
        with ControlPlane(find_binaries(), workdir=work / "cp") as cp:
            kube = Kube.from_config(str(cp.kubeconfig))
            install_crds(kube)
            emu_dir = work / "emulator"
            emulator = EmulatorProcess(
                async_polls=1,
                task_seconds=5,
                workdir=emu_dir,
                extra_args=process_args(emu_dir, fsas_config) if fsas else (),
            )
            emulator.start()
            procs.append(emulator)
            kube.create(path("v1", "namespaces"), {"metadata": {"name": "composable-dra"}})
            kube.create(
                path("v1", "secrets", namespace="composable-dra"),
                {
                    "metadata": {"name": FABRIC},
                    "data": {
                        k: base64.b64encode(v.encode()).decode()
                        for k, v in {
                            "username": "admin",
                            "password": "admin",
                            "client_id": FSAS.client_id,
                            "client_secret": FSAS.client_secret,
                        }.items()
                    },
                },
            )
            kube.create(
                path(API_VERSION, "fabrics"),
                {
                    "apiVersion": API_VERSION,
                    "kind": "Fabric",
                    "metadata": {"name": FABRIC},
                    "spec": {
                        "backend": args.backend,
                        **(
                            {"fsas": fsas_settings(emulator.state()["blocks"], pick)}
                            if fsas
                            else {}
                        ),
                        "endpoint": emulator.url,
                        "credentialsSecret": {"name": FABRIC, "namespace": "composable-dra"},
                        "operationTimeoutSeconds": 120,
                        "orphanPolicy": "Ignore",
                    },
                },
            )
            creds = work / "redfish.yaml"
            creds.write_text("username: admin\npassword: admin\n")
            hosts = ["node-1", "node-2", "node-3"]
            for host in hosts:
                create_node(kube.api, host, system_uuid=host_uuid(host))
                plugin = PluginProcess(
                    node=host,
                    kubeconfig=cp.kubeconfig,
                    plugins_registry_dir=work / host / "registry",
                    plugins_dir=work / host / "p",
                    cdi_dir=work / host / "cdi",
                    workdir=work / host / "plugin",
                    extra_args=redfish_source_args(emulator.url, creds, 1),
                )
                plugin.start()
                procs.append(plugin)
            operator = ComponentProcess(
                "operator",
                [
                    f"--kubeconfig={cp.kubeconfig}",
                    "--leader-elect-namespace=kube-system",
                    "--metrics-port=0",
                    "--online-poll-seconds=3",
                ],
                work / "operator",
            ).start()
            procs.append(operator)

            blocks0 = emulator.state()["blocks"]
            zones = {b: s["zone"] for b, s in blocks0.items()}
            reach = {"zone-1": ["node-1", "node-2"], "zone-2": ["node-2", "node-3"]}
            # Every attach request takes a while to reach the fabric: a
            # cancelled one is then still on its way when its resource is deleted.
            emulator.set_faults(
                [
                    *faults(args.seed, paths),
                    {
                        "kind": "latency",
                        "method": paths["attach_method"],
                        "path": paths["attach"],
                        "latency": args.attach_latency,
                    },
                ]
                if args.attach_latency > 0
                else faults(args.seed, paths)
            )
            kills = set(rng.sample(range(10, args.operations), args.kills))
            restarts = 0
            created = 0
            cancelled = 0

            def resources() -> list[JSON]:
                items: list[JSON] = kube.get(RESOURCES)["items"]
                return items

            def settled_enough() -> bool:
                busy = [
                    r
                    for r in resources()
                    if r["metadata"].get("deletionTimestamp")
                    or phase(r) not in ("Online", "Failed")
                ]
                return len(busy) < int(args.in_flight)

            started = time.monotonic()
            for i in range(args.operations):
                wait_for(settled_enough, 300, "room for another change", interval=0.2)
                everything = resources()
                live = [r for r in everything if not r["metadata"].get("deletionTimestamp")]
                named = {r["spec"]["deviceID"] for r in live}
                if pick:
                    free = room(emulator.state()["blocks"], everything, reach)
                else:
                    free = [(b, rng.choice(reach[zones[b]])) for b in zones if b not in named]
                deletable = [r for r in live if phase(r) in ("Online", "Failed")]
                if free and (rng.random() < 0.55 or not deletable):
                    block, node = rng.choice(free)
                    created += 1
                    spec = {"fabric": FABRIC, "deviceID": block, "targetNode": node}
                    if pick:  # a slot of the model: the FM picks the GPU
                        model = blocks0[block]["model"]
                        block = slot_name(zones[block], model, created)
                        spec = {**spec, "deviceID": block, "model": model}
                    name = f"r{created}-{block}"
                    kube.create(
                        RESOURCES,
                        {
                            "apiVersion": API_VERSION,
                            "kind": "ComposableResource",
                            "metadata": {"name": name},
                            "spec": spec,
                        },
                    )
                    if rng.random() < args.cancel:
                        r_path = path(API_VERSION, "composableresources", name)

                        def under_way(r_path: str = r_path, block: str = block) -> bool:
                            r = kube.get_or_none(r_path) or {}
                            if pick or phase(r) not in ("", "Online"):
                                return phase(r) not in ("", "Online")
                            return bool(emulator.state()["blocks"][block]["state"] != "Unused")

                        # An operator killed meanwhile may take a while to come back.
                        wait_for(under_way, 120, f"the attach of {name} to start", interval=0.05)
                        kube.delete(r_path)
                        cancelled += 1
                elif deletable:
                    victim = rng.choice(deletable)
                    kube.delete(
                        path(API_VERSION, "composableresources", victim["metadata"]["name"])
                    )
                if i in kills:
                    operator.kill()
                    operator.start()
                    restarts += 1
                print(f"op {i + 1}/{args.operations}: {len(live)} resources", file=sys.stderr)
            ops_s = time.monotonic() - started

            fault_state = emulator.faults()
            emulator.clear_faults()
            t0 = time.monotonic()

            def settled() -> bool:
                items = resources()
                for r in items:
                    # Given up (under faults, or on a block someone else holds): clean up
                    # as a user would.
                    if phase(r) == "Failed" and not r["metadata"].get("deletionTimestamp"):
                        kube.delete(path(API_VERSION, "composableresources", r["metadata"]["name"]))
                tasks = emulator.state()["tasks"].values()
                return all(t != "Running" for t in tasks) and all(
                    phase(r) == "Online" and not r["metadata"].get("deletionTimestamp")
                    for r in items
                )

            wait_for(
                settled,
                600,
                "every resource to settle",
                interval=0.5,
                describe=lambda: str(
                    [(r["metadata"]["name"], phase(r)) for r in resources() if phase(r) != "Online"]
                ),
            )
            settle_s = time.monotonic() - t0

            blocks = emulator.state()["blocks"]
            attached = {b: s["system"] for b, s in blocks.items() if s["state"] == "Composed"}
            stuck = [b for b, s in blocks.items() if s["state"] not in ("Composed", "Unused")]
            final = resources()
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
            result = {
                "backend": args.backend,
                "operations": args.operations,
                "cancelled": cancelled,
                "restarts": restarts,
                "leaked": len(leaked) + len(stuck),
                "double_attached": len(double),
                "leaked_items": sorted(leaked + stuck),
                "double_items": sorted(double),
                "resources_online": len(final),
                "blocks_attached": len(attached),
                "operations_s": round(ops_s, 1),
                "settle_s": round(settle_s, 1),
                "faults_fired": {
                    f"{r['kind']}:{r.get('method') or '*'}": r.get("fired", 0) for r in fault_state
                },
            }
            for p in reversed(procs):
                p.stop()
            procs.clear()
            clean = not leaked and not stuck and not double
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
