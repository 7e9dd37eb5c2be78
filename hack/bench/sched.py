"""Scheduler throughput: how fast kube-scheduler allocates pool claims at cluster size,
against the same claims served by free local GPUs on the same cluster.

No controllers of ours: a local control plane, ``--nodes`` Node objects with
``--gpus-per-node`` local GPUs each in ResourceSlices, every one held by a placeholder
claim (``hack/bench/scale.py``'s setup), and the fabric pools' slices for ``--pool-gpus``
GPUs in ``--zones`` zones, built by the pool publisher's own functions (``desired_pools``,
``plan_pools``). Then ``--pods`` pods, each with the suite's claim (a local GPU first, else
a pool GPU: ``harness.claim_body``), are created at once. Their claims are allocated in
the scheduling cycle; the pods then wait in PreBind on the binding conditions (nothing
makes them ready here), which does not hold up the next scheduling cycle. The same
functions rewrite a pool after each allocation as the running publisher does (the device
tainted, the window of free devices moved on and sized to the pending claims, a new
generation; ``--no-republish``: never). ``--max-free auto,32,0`` runs one pool burst per
pool window (free devices a pool offers: ``auto``, the publisher's default; 0: all) in the
same cluster, in that order. Then, unless ``--modes pool``, the local burst: the same
number of the same claims, with enough placeholders deleted that every node has free
local GPUs for them (the pool bursts' pods stay, holding their pool GPUs).

Reported per burst: claims allocated per second (first to last allocation), created ->
allocated p50/p99, the scheduler's own CPU seconds per claim (``/proc/<pid>/stat``: what
the machine's load does not change), the DRA plugin's Filter/PreFilter time per call
from the scheduler's ``/metrics``, and with ``--profile S`` a CPU profile of the
scheduler for S seconds from the burst's start (``/debug/pprof``; read it with
``go tool pprof -top``; the path is in the JSON). docs/attach-flow.md, Scale, has the
findings. The last line is JSON with the goals (issue 28), from the pool burst at the
publisher's default window and the local burst, with the scheduler's defaults:
``pool_vs_local_cpu_per_claim`` (scheduler CPU per claim, pool over local, <= 1.5) and
``pool_vs_local_claims_per_s`` (claims allocated per second, pool over local, >= 0.5), and
every claim allocated; the exit status is 1 when one is missed.

    python -m hack.bench.sched --nodes 1000 --pods 100
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import json
import os
import re
import ssl
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import yaml

from composable_dra.fabric.backend import Device, Host, Inventory, Zone
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from fabric_emulator.topology import host_uuid
from hack.bench.goals import finish, goal
from hack.bench.scale import (
    PLACEHOLDERS,
    RESOURCE,
    add_shape_arguments,
    cpu_seconds,
    fabric_topology,
    host_ids,
    local_devices,
    parallel,
    populate,
)
from hack.bench.stats import percentile
from pool_publisher.node_labels import own_label
from pool_publisher.publish import (
    FIELD_MANAGER,
    FabricView,
    desired_pools,
    live_allocations,
    plan_pools,
    published_devices,
)
from pool_publisher.window import AUTO, WindowPolicy, pending_claims, window_size
from pool_publisher.zone_select import NodeLabel
from testbed import ControlPlane
from testbed.controlplane import find_binaries
from testbed.harness import PAUSE_IMAGE, claim_body
from testbed.objects import ensure_device_class, pod_body
from testbed.wait import wait_for

FABRIC = "fabric-1"
CPU_RATIO_CEILING = 1.5  # pool claims' scheduler CPU per claim over local ones'
RATE_RATIO_FLOOR = 0.5  # pool claims allocated per second over local ones
BURST_LABEL = "bench.composable.dra.io/burst"
SCHEDULER_METRICS = (
    "scheduler_scheduling_attempt_duration_seconds",
    "scheduler_framework_extension_point_duration_seconds",
    "scheduler_plugin_execution_duration_seconds",
)


def inventory(nodes: int, zones: int, pool_gpus: int) -> Inventory:
    """scale.py's fabric as the publisher reads it, every GPU free."""
    topo = fabric_topology(nodes, zones, pool_gpus)
    devices = {
        b["id"]: Device(
            id=b["id"],
            model=b["model"],
            zone=z["id"],
            uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"sched-bench/{b['id']}")),
            state="free",
            memory_mib=b["memory_mib"],
            manufacturer="NVIDIA",
        )
        for z in topo["zones"]
        for b in z["blocks"]
    }
    return Inventory(
        hosts={h["id"]: Host(h["id"], host_uuid(h["id"])) for h in topo["hosts"]},
        devices=devices,
        zones={
            z["id"]: Zone(z["id"], frozenset(z["hosts"]), frozenset(b["id"] for b in z["blocks"]))
            for z in topo["zones"]
        },
    )


def zone_node_label(zone: str) -> NodeLabel:
    """The label the bench puts on a zone's Nodes: the publisher's own, which it puts there
    by default (pool_publisher/node_labels.py)."""
    return own_label(FABRIC, zone)


def fabric_view(
    inv: Inventory, node_name: Callable[[str], str], by_label: bool = True
) -> FabricView:
    """The publisher's view; ``by_label``: every zone has a label its nodes carry
    (``label_zone_nodes``), so the pools select them by it, not by hostname."""
    zone_labels = {
        z.id: (zone_node_label(z.id), frozenset(node_name(h) for h in z.hosts))
        for z in inv.zones.values()
        if by_label
    }
    return FabricView(
        FABRIC, "fabric-uid", inv, {h: [node_name(h)] for h in inv.hosts}, zone_labels=zone_labels
    )


def label_zone_nodes(kube: Kube, view: FabricView) -> None:
    """Put each zone's label (``view.zone_labels``) on the zone's Nodes."""
    wanted: dict[str, dict[str, str]] = {}
    for label, nodes in view.zone_labels.values():
        for node in nodes:
            wanted.setdefault(node, {})[label.key] = label.value
    parallel(
        lambda item: kube.merge_patch(
            path("v1", "nodes", item[0]), {"metadata": {"labels": item[1]}}
        ),
        sorted(wanted.items()),
    )


def without_owner(obj: JSON) -> JSON:
    """A copy with no owner reference: no Fabric object exists here, and one to none would
    be collected. The publisher's own copy keeps it, so it compares equal next pass."""
    out = copy.deepcopy(obj)
    out["metadata"].pop("ownerReferences", None)
    return out


def burst_claim(name: str) -> JSON:
    """Suite.create_claim's claim (a local GPU first, else a pool GPU), labelled."""
    claim = claim_body(name)
    claim["metadata"]["labels"] = {BURST_LABEL: "true"}
    return claim


class Republisher:
    """The publisher's reaction to claims, from its pure functions: each allocated pool
    device gets its taint, the window of free devices moves on and follows the pending
    claims, and the pool gets a new generation (publish.py, ``PoolPublisher.reconcile``)."""

    def __init__(self, kube: Kube, view: FabricView) -> None:
        self.kube, self.view, self.window = kube, view, WindowPolicy()
        # The cluster's nodes, for the window's cap (the publisher counts its Node cache).
        self.nodes = len({n for ns in view.host_nodes.values() for n in ns})
        self.observed: dict[str, JSON] = {}
        self.generations: dict[str, int] = {}
        self.live: set[tuple[str, str]] = set()
        self.pending = 0
        self.size = 0  # the window's size at the last pass
        self.writes = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def allocated(self, claims: list[JSON]) -> None:
        self.live = live_allocations(claims, names.DRIVER)
        self.pending = pending_claims(claims)
        self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Before the control plane goes: no write is under way after this."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._stop.wait(0.05)  # the publisher's debounce
            self._wake.clear()
            if not self._stop.is_set():
                self.publish()

    def publish(self) -> None:
        with self._lock:
            live = set(self.live)
            # An allocated device is attached by the scaler: held, no longer free.
            view = dataclasses.replace(self.view, held=frozenset(d for _, d in live))
            observed = list(self.observed.values())
            pools = len(self.view.inventory.zones)
            self.size = window_size(self.pending, pools, self.size, self.window, nodes=self.nodes)
            desired = desired_pools(view, live, self.size, published_devices(observed))
            plan = plan_pools(desired, observed, names.DRIVER, self.generations)
            for obj in plan.apply:
                self.kube.apply(
                    path(RESOURCE, "resourceslices", obj["metadata"]["name"]),
                    without_owner(obj),
                    FIELD_MANAGER,
                )
                self.observed[obj["metadata"]["name"]] = obj
                self.writes += 1
            for name in plan.delete:
                self.kube.delete(path(RESOURCE, "resourceslices", name))
                self.observed.pop(name, None)
                self.writes += 1
            self.generations = plan.generations


def _tls(cp: ControlPlane) -> ssl.SSLContext:
    cfg = yaml.safe_load(cp.kubeconfig.read_text())
    user = cfg["users"][0]["user"]
    ctx = ssl._create_unverified_context()  # noqa: S323 - the scheduler's self-signed cert
    ctx.load_cert_chain(user["client-certificate"], user["client-key"])
    return ctx


def scheduler_get(cp: ControlPlane, what: str, timeout: float) -> bytes:
    url = f"https://127.0.0.1:{cp.scheduler_port}{what}"
    with urllib.request.urlopen(url, timeout=timeout, context=_tls(cp)) as resp:
        return bytes(resp.read())


def metric_sums(text: str) -> dict[str, float]:
    """``<name>_sum`` and ``_count`` series of the scheduler metrics we read, by labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+?)_(sum|count)(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m and m.group(1) in SCHEDULER_METRICS:
            labels = m.group(3) or ""
            keep = ",".join(
                kv
                for kv in labels.strip("{}").split(",")
                if kv.split("=")[0] in ("extension_point", "plugin", "result")
            )
            if ('extension_point="' in keep and not re.search(r'"(Pre)?Filter"', keep)) or (
                "plugin=" in keep and "DynamicResources" not in keep
            ):
                continue  # the DRA plugin's filtering is what this bench is about
            key = f"{m.group(1)}_{m.group(2)}{{{keep}}}"
            out[key] = out.get(key, 0.0) + float(m.group(4))
    return out


def per_attempt(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean seconds per call of each series over the burst."""
    out = {}
    for key, total in after.items():
        if "_sum{" not in key:
            continue
        count_key = key.replace("_sum{", "_count{")
        n = after.get(count_key, 0.0) - before.get(count_key, 0.0)
        if n > 0:
            name = key.replace("_sum", "")
            out[name] = round((total - before.get(key, 0.0)) / n, 5)
            out[name + " calls"] = n
    return out


def allocation_figures(
    start: float, created: dict[str, float], allocated: dict[str, float], cpu: float
) -> JSON:
    """A burst's pace from the times its pods were created and its claims allocated."""
    times = sorted(allocated.values())
    lat = [allocated[n] - created[n] for n in allocated if n in created]
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "allocated": len(allocated),
        "claims_per_s": round((len(times) - 1) / span, 3) if span > 0 else None,
        "first_allocated_s": round(times[0] - start, 2) if times else None,
        "last_allocated_s": round(times[-1] - start, 2) if times else None,
        "allocated_p50_s": round(statistics.median(lat), 2) if lat else None,
        "allocated_p99_s": round(percentile(lat, 0.99), 2) if lat else None,
        # The scheduler's own CPU (utime + stime) per claim: what load on the machine
        # does not change.
        "scheduler_cpu_s_per_claim": round(cpu / max(1, len(allocated)), 3),
        "load": os.getloadavg()[0],
    }


def burst(
    cp: ControlPlane,
    kube: Kube,
    pods: int,
    args: argparse.Namespace,
    tag: str,
    claims_seen: Callable[[], None] = lambda: None,
) -> JSON:
    """``pods`` pods with their claims at once; how fast the scheduler allocates them.
    ``claims_seen`` returns once the publisher has seen the claims (its window follows
    them)."""
    ns = f"burst-{tag}"
    kube.create(path("v1", "namespaces"), {"metadata": {"name": ns}})
    allocated: dict[str, float] = {}
    served_by: dict[str, str] = {}  # claim -> the alternative that served it

    def seen(kind: str, obj: JSON) -> None:
        allocation = (obj.get("status") or {}).get("allocation")
        if kind in ("ADDED", "MODIFIED") and allocation:
            allocated.setdefault(obj["metadata"]["name"], time.time())
            for r in (allocation.get("devices") or {}).get("results") or []:
                served_by[obj["metadata"]["name"]] = str(r.get("request"))

    claims_inf = Informer(
        kube, path(RESOURCE, "resourceclaims", namespace=ns), on_event=seen, name=f"claims-{ns}"
    )
    claims_inf.start()
    names_ = [f"c{i}" for i in range(pods)]
    parallel(
        lambda n: kube.create(path(RESOURCE, "resourceclaims", namespace=ns), burst_claim(n)),
        names_,
    )
    claims_seen()
    before = metric_sums(scheduler_get(cp, "/metrics", 30).decode())
    cpu0 = cpu_seconds(cp.pid("kube-scheduler"))
    created: dict[str, float] = {}
    profile: list[bytes] = []

    def take() -> None:
        what = f"/debug/pprof/profile?seconds={args.profile}"
        profile.append(scheduler_get(cp, what, args.profile + 60))

    prof_thread = threading.Thread(target=take, daemon=True)

    def pod(n: str) -> None:
        created[n] = time.time()
        kube.create(path("v1", "pods", namespace=ns), pod_body(n, n, image=PAUSE_IMAGE))

    start = time.time()
    if args.profile:
        prof_thread.start()
    parallel(pod, names_)
    try:
        wait_for(lambda: len(allocated) >= pods, args.timeout, "every claim allocated", 0.5)
    except AssertionError as exc:
        print(f"{tag}: not every claim allocated: {exc}", flush=True)
    cpu = cpu_seconds(cp.pid("kube-scheduler")) - cpu0
    after = metric_sums(scheduler_get(cp, "/metrics", 30).decode())
    if args.profile:
        prof_thread.join(args.profile + 90)
    claims_inf.stop()
    # Pods the burst left pending would be scheduled during the next burst: gone.
    for n in set(names_) - set(allocated):
        kube.delete(path("v1", "pods", n, namespace=ns))
    out = allocation_figures(start, created, allocated, cpu)
    out["served_by"] = dict(collections.Counter(served_by.values()))
    out["per_call_s"] = per_attempt(before, after)
    if profile:
        prof = args.workdir / f"scheduler-{tag}.cpu.pprof"
        prof.write_bytes(profile[0])
        out["profile"] = str(prof)
    return out


def window_of(text: str) -> int:
    """``--max-free``'s values: ``auto`` (the publisher's default), 0 (all) or a count."""
    return AUTO if text == "auto" else int(text)


def free_local_gpus(kube: Kube, suffix: str, nodes: int, gpus_per_node: int, pods: int) -> int:
    """Delete placeholders so that every node has free local GPUs for its share of ``pods``
    claims and one more (the scheduler need not spread them evenly). Returns how many."""
    per_node = min(gpus_per_node, -(-pods // nodes) + 1)
    claims = [
        f"{host}-{suffix}-{dev.name}"[:253]
        for host in host_ids(nodes)
        for dev in local_devices(f"{host}-{suffix}", gpus_per_node)[:per_node]
    ]
    parallel(
        lambda c: kube.delete(path(RESOURCE, "resourceclaims", c, namespace=PLACEHOLDERS)), claims
    )
    return len(claims)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def sched_goals(out: JSON, pods: int) -> dict[str, JSON]:
    """Issue 28's goals: the pool burst at the publisher's default window against the
    local burst, and every claim allocated."""
    pool, local = out["bursts"].get("pool-auto"), out["bursts"].get("local")
    goals = {
        "unallocated": goal(sum(pods - b["allocated"] for b in out["bursts"].values()), ceiling=0)
    }
    if local is not None:  # a free local GPU wins over a pool GPU
        served = local.get("served_by") or {}
        goals["local_burst_served_locally"] = goal(served.get("gpu/local", 0), floor=pods)
    if pool is not None and local is not None:
        cpu = ratio(pool["scheduler_cpu_s_per_claim"], local["scheduler_cpu_s_per_claim"])
        rate = ratio(pool["claims_per_s"], local["claims_per_s"])
        goals["pool_vs_local_cpu_per_claim"] = goal(cpu, ceiling=CPU_RATIO_CEILING)
        goals["pool_vs_local_claims_per_s"] = goal(rate, floor=RATE_RATIO_FLOOR)
    return goals


def pool_burst(
    cp: ControlPlane, kube: Kube, republisher: Republisher, args: argparse.Namespace, tag: str
) -> JSON:
    """A burst served by the pools, the republisher's window following its claims."""
    writes = republisher.writes
    window: list[int] = []

    def claims_seen() -> None:
        if args.republish:
            wait_for(lambda: republisher.pending >= args.pods, 60, "the claims seen")
            republisher.publish()
        window.append(republisher.size)

    out = burst(cp, kube, args.pods, args, tag, claims_seen)
    out["republish_writes"] = republisher.writes - writes
    out["window"] = window[0] if window else None  # free devices a pool offered at the start
    return out


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_arguments(p, nodes=100)
    p.add_argument("--pods", type=int, default=100, help="pods a burst")
    p.add_argument("--republish", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--max-free",
        default="auto",
        help="free devices a pool offers (auto: the publisher's default; 0: all); a "
        "comma-separated list runs one pool burst for each, in order, in the same cluster "
        "(the pods a burst leaves pending are deleted before the next)",
    )
    p.add_argument("--modes", default="pool,local", help="pool, local or both (pool bursts first)")
    p.add_argument("--profile", type=int, default=0, help="CPU profile seconds (0: none)")
    p.add_argument("--scheduler-config", type=json.loads, default={})
    p.add_argument(
        "--zone-selector",
        choices=("label", "hostname"),
        default="label",
        help="how pool slices select their zone's nodes: one label per zone (the publisher's "
        "default: the bench puts the publisher's labels on the Nodes) or the hostname list "
        "(the publisher's --no-label-nodes)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = arguments()
    args = p.parse_args(argv)
    modes = set(str(args.modes).split(","))
    variants = [window_of(x) for x in str(args.max_free).split(",")] if "pool" in modes else []
    if args.pods * len(variants) > args.pool_gpus:
        p.error("the pool has fewer GPUs than the bursts' claims")

    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sched-", dir="/tmp"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    out: JSON = {
        "nodes": args.nodes,
        "pods": args.pods,
        "zones": args.zones,
        "pool_gpus": args.pool_gpus,
        "republish": args.republish,
        "scheduler_config": args.scheduler_config,
        "zone_selector": args.zone_selector,
    }
    with ControlPlane(
        find_binaries(), workdir=args.workdir / "cp", scheduler_config=args.scheduler_config
    ) as cp:
        kube = cp.kube(pool_size=16, user_agent="bench/sched")
        ensure_device_class(kube)
        suffix = "s"
        t = time.monotonic()
        populate(kube, suffix, host_ids(args.nodes), args.gpus_per_node)
        view = fabric_view(
            inventory(args.nodes, args.zones, args.pool_gpus),
            lambda h: f"{h}-{suffix}",
            by_label=args.zone_selector == "label",
        )
        label_zone_nodes(kube, view)
        republisher = Republisher(kube, view)
        out["setup_s"] = round(time.monotonic() - t, 1)
        # Every allocation of every burst, for the republisher.
        every = Informer(
            kube,
            path(RESOURCE, "resourceclaims"),
            on_event=lambda *_: republisher.allocated(every.items()),
            name="burst-claims",
            labelSelector=f"{BURST_LABEL}=true",
        )
        if args.republish:
            every.start()
            republisher.start()
        out["bursts"] = {}
        try:
            for max_free in variants:
                republisher.window = WindowPolicy(max_free)
                republisher.publish()
                tag = "pool-" + {AUTO: "auto", 0: "all"}.get(max_free, str(max_free))
                out["bursts"][tag] = pool_burst(cp, kube, republisher, args, tag)
            if "local" in modes:
                republisher.window = WindowPolicy()  # the publisher's default again
                republisher.publish()
                freed = free_local_gpus(kube, suffix, args.nodes, args.gpus_per_node, args.pods)
                out["bursts"]["local"] = burst(cp, kube, args.pods, args, "local")
                out["bursts"]["local"]["local_gpus_freed"] = freed
        finally:
            republisher.stop()
            every.stop()
    return finish(out, sched_goals(out, args.pods))


if __name__ == "__main__":
    raise SystemExit(main())
