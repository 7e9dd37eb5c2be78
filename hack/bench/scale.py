"""Scale: the suite's controllers at cluster size, pool claims arriving in bursts.

A local control plane (its API server writes an audit log), ``--nodes`` fake nodes (Node
objects only: no kubelets, no plugins) with ``--gpus-per-node`` node-local GPUs each in
ResourceSlices that the bench writes as each node's plugin would (``dra_driver/slices.py``),
every local GPU allocated to a placeholder claim (the bench writes ``status.allocation`` as
the scheduler would), and a fabric of ``--pool-gpus`` GPU blocks in ``--zones`` zones in
the emulator. The operator, pool publisher and scaler run as processes
(testbed/harness.py); the bench stands in for the plugins' one write of the
attach flow (``DeviceVisible``, once the operator has recorded the attached GPU's UUID).
Then ``--first`` pods with pool claims are created at once, and when every claim is
ready, ``--claims`` more. kube-scheduler, the pool publisher and the Fabric run with
their defaults (issue 28); ``--percentage-of-nodes-to-score`` and ``--pool-window`` set the
optional tuning of docs/operations.md, and ``--fabric-poll`` the Fabric's poll interval
(its default 30 s; each poll reads the whole inventory, in the operator and in the
publisher, and the emulator that answers shares the bench's two cores).

Per burst: ``ready_p50_s``/``ready_p99_s`` (``FabricDeviceReady`` - pod created, no
latency subtracted), the controllers' CPU seconds per claim (``utime + stime`` of each
process, ``/proc/<pid>/stat``), ``bound_at_first_recheck`` (bound within the scheduler's
first 5 s re-check after allocation) and, from the audit log (one event per request with
its user agent: ``composable-dra/<component>``, ``kopf/...`` for the operator's kopf),
API writes per attach by component and resource, and every LIST the controllers made
after start. Peak RSS is each process's ``VmHWM``.

Goals (issues 16 and 28): every claim ready; ``ready_p99_s`` <= 150 s and
``cpu_per_claim_s`` (the controllers' CPU per ready claim) <= 0.1 s in the second burst;
``cost_ratio_1000_vs_100`` (CPU per claim in the
second burst over the first) <= 1.5; each controller <= 300 MB RSS; no full relist
(a LIST with no label or field selector of a collection the component had listed before)
after start; writes per attach <=
``WRITES_PER_ATTACH_CEILING`` (why each is needed: ``NEEDED_WRITES``). The last line is
JSON, and the exit status is 1 when a goal is missed.

    python -m hack.bench.scale                       # 1,000 nodes, 100 then 1,000 claims
    python -m hack.bench.scale --nodes 50 --claims 50 --first 10 --pool-gpus 200
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.v1alpha1 import API_VERSION, FabricSpec
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.k8s.timestamps import parse_time
from composable_dra.k8s.wake import TOUCH_EVENT
from composable_dra.model import names
from composable_dra.model.names import normalize_uuid
from dra_driver.device_source import DeviceInfo, device_name_for
from dra_driver.device_visibility import visibility_updates
from dra_driver.slices import FIELD_MANAGER as PLUGIN_FIELD_MANAGER
from dra_driver.slices import desired_slices
from fabric_emulator.topology import H100, host_uuid
from hack.bench.goals import finish, goal
from hack.bench.stats import percentile
from hack.bench.time_to_gpu import (
    PREBIND_POLL_S,
    Recorder,
    breakdown,
    claim_times,
)
from testbed import ControlPlane
from testbed.controlplane import find_binaries
from testbed.harness import Suite, SuiteOptions
from testbed.nodes import create_node
from testbed.wait import wait_for

RESOURCE = "resource.k8s.io/v1"
FABRIC_POLL_DEFAULT_S = FabricSpec.model_fields["poll_interval_seconds"].default
PLACEHOLDERS = "placeholders"
RSS_CEILING_MB = 300.0
READY_P99_CEILING_S = 150.0  # the second burst's, on the shared 2-core machine
CPU_PER_CLAIM_CEILING_S = 0.1  # the controllers' CPU per ready claim, second burst
COST_RATIO_CEILING = 1.5
# The API writes one attach needs, by component, and why (docs/attach-flow.md, Scale).
NEEDED_WRITES = {
    "scaler": "create the ComposableResource; FabricDeviceReady on the claim",
    "operator": "its finalizer; phase Attaching with the fabric task; Attached and the "
    "device UUID; phase Online",
    "plugin": "DeviceVisible",
    "pool-publisher": "the zone's slice, marking the device allocated (shared by every "
    "attach in the zone that one pass sees)",
}
WRITES_PER_ATTACH_CEILING = 8.0  # 2 + 4 + 1 + 1
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # One event per request, when it is answered (a watch: when it starts and ends).
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


# -- the cluster's shape ---------------------------------------------------------------


def add_shape_arguments(p: argparse.ArgumentParser, nodes: int) -> None:
    """The flags of the emulated cluster that this bench and sched.py build (``nodes``: its
    default), a burst's timeout and the work directory."""
    p.add_argument("--nodes", type=int, default=nodes)
    p.add_argument("--zones", type=int, default=16)
    p.add_argument("--pool-gpus", type=int, default=4000)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--timeout", type=float, default=900, help="seconds per burst")
    p.add_argument("--workdir", type=Path, default=None, help="keep the run's files and logs here")


def host_ids(nodes: int) -> list[str]:
    return [f"node-{i + 1}" for i in range(nodes)]


def fabric_topology(nodes: int, zones: int, pool_gpus: int) -> dict[str, Any]:
    """``nodes`` hosts dealt round-robin into ``zones`` zones; ``pool_gpus`` H100 blocks
    spread evenly over the zones."""
    if zones < 1 or nodes < zones:
        raise ValueError(f"{nodes} nodes cannot fill {zones} zones")
    hosts = host_ids(nodes)
    return {
        "hosts": [{"id": h} for h in hosts],
        "zones": [
            {
                "id": f"zone-{z + 1}",
                "hosts": hosts[z::zones],
                "blocks": [
                    {"id": f"pool-{j + 1}", "model": H100, "memory_mib": 81559}
                    for j in range(z, pool_gpus, zones)
                ],
            }
            for z in range(zones)
        ],
    }


def local_devices(node: str, count: int) -> list[DeviceInfo]:
    """The node's own GPUs, as the plugin's device source would report them."""
    out = []
    for k in range(count):
        gpu = "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"scale-bench/{node}/{k}"))
        out.append(
            DeviceInfo(
                name=device_name_for(gpu),
                uuid=gpu,
                product_name=H100,
                model=H100,
                memory_bytes=81559 * 2**20,
            )
        )
    return out


def placeholder_claim(name: str) -> JSON:
    return {
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": names.DEVICE_CLASS}}]
            }
        },
    }


def local_allocation(node: str, device: str) -> JSON:
    """``status.allocation`` of a claim given ``device`` of ``node``'s own pool, as the
    scheduler writes it."""
    return {
        "devices": {
            "results": [{"request": "gpu", "driver": names.DRIVER, "pool": node, "device": device}]
        },
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


# -- process figures --------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    # Fields 14 and 15 of proc(5); the split starts at field 3 (state).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmHWM for process {pid}")


# -- the audit log ----------------------------------------------------------------------


def component_of(user_agent: str) -> str | None:
    """Our component from a request's user agent; None for anyone else."""
    if user_agent.startswith("kopf/"):
        return "operator"
    if user_agent.startswith("composable-dra/"):
        return user_agent.split("/", 2)[1].split(" ", 1)[0]
    return None


@dataclass(frozen=True)
class Request:
    at: float
    component: str
    verb: str
    resource: str
    full_list: bool  # a LIST of a whole collection: no selector, its first page
    code: int = 200  # the response's status


def parse_audit(lines: Iterable[str]) -> Iterator[Request]:
    """Our components' requests, one per completed request, from the audit log's lines."""
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("stage") != "ResponseComplete":
            continue
        who = component_of(str(ev.get("userAgent", "")))
        if who is None:
            continue
        ref = ev.get("objectRef") or {}
        resource = str(ref.get("resource", "?"))
        if ref.get("subresource"):
            resource += "/" + str(ref["subresource"])
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(ev.get("requestURI", "")).query)
        verb = str(ev.get("verb", ""))
        yield Request(
            at=_rfc3339(str(ev.get("requestReceivedTimestamp", ""))),
            component=who,
            verb=verb,
            resource=resource,
            full_list=verb == "list"
            and not query.get("labelSelector")
            and not query.get("fieldSelector")
            and not query.get("continue"),  # a later page of the same LIST
            code=int((ev.get("responseStatus") or {}).get("code") or 0),
        )


def _rfc3339(stamp: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def writes_by_component(
    requests: Iterable[Request], start: float, end: float
) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for r in requests:
        if start <= r.at < end and r.verb in WRITE_VERBS:
            out.setdefault(r.component, Counter())[f"{r.verb} {r.resource}"] += 1
    return out


def lists_after(requests: Iterable[Request], start: float) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for r in requests:
        if r.at >= start and r.verb == "list":
            kind = "full" if r.full_list else "selected"
            out.setdefault(r.component, Counter())[f"{kind} {r.resource}"] += 1
    return out


def full_relists(requests: Iterable[Request], start: float) -> dict[str, Counter[str]]:
    """Full LISTs from ``start`` on of a collection that the same component had listed
    whole before with success: a component's first list is its start, wherever it falls
    (one slowed by a 429 may come after the pools are up); any later one is a relist."""
    listed: set[tuple[str, str]] = set()
    out: dict[str, Counter[str]] = {}
    for r in sorted(requests, key=lambda r: r.at):
        if r.verb != "list" or not r.full_list:
            continue
        if (r.component, r.resource) in listed and r.at >= start:
            out.setdefault(r.component, Counter())[r.resource] += 1
        if 200 <= r.code < 300:
            listed.add((r.component, r.resource))
    return out


# -- the plugins' part --------------------------------------------------------------------


class StandInPlugins:
    """What every node's plugin writes in the attach flow, for nodes that have none:
    ``DeviceVisible`` once the operator records the attached GPU's UUID (the fabric's
    GPU is on the node at once here). The same write as dra_driver/device_visibility.py."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="stand-in")
        self._done: set[str] = set()
        self._resources = Informer(
            kube,
            path(API_VERSION, "composableresources"),
            on_event=lambda kind, obj: self._see(obj) if kind != "DELETED" else None,
            name="stand-in-resources",
        )

    def start(self) -> None:
        self._resources.start()

    def stop(self) -> None:
        self._resources.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _see(self, obj: JSON) -> None:
        uid = str((obj.get("status") or {}).get("deviceUUID") or "")
        if not uid or obj["metadata"]["name"] in self._done:
            return
        if visibility_updates([obj], {normalize_uuid(uid)}).get(obj["metadata"]["name"]):
            self._done.add(obj["metadata"]["name"])
            self._pool.submit(
                self._write, obj["metadata"]["name"], obj["spec"].get("targetNode", "")
            )

    def _write(self, name: str, node: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        condition = {
            "type": names.DEVICE_VISIBLE,
            "status": "True",
            "reason": "FoundOnNode",
            "message": f"the device is among node {node}'s GPUs",
            "lastTransitionTime": stamp,
        }
        try:
            self.kube.apply(
                path(API_VERSION, "composableresources", name, subresource="status"),
                {
                    "apiVersion": API_VERSION,
                    "kind": "ComposableResource",
                    "metadata": {"name": name},
                    "status": {"conditions": [condition]},
                },
                PLUGIN_FIELD_MANAGER,
            )
        except KubeError:
            self._done.discard(name)  # seen again at its next change


# -- setup ----------------------------------------------------------------------------------


def parallel(fn: Callable[[Any], object], items: Iterable[Any], workers: int = 8) -> None:
    with ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(fn, items):
            pass


def populate(kube: Kube, suffix: str, hosts: list[str], gpus_per_node: int) -> None:
    """Nodes, their slices, and a placeholder claim allocated to each local GPU."""
    kube.create(path("v1", "namespaces"), {"metadata": {"name": PLACEHOLDERS}})

    def one(host: str) -> None:
        node = f"{host}-{suffix}"
        created = create_node(kube.api, node, system_uuid=host_uuid(host))
        devices = local_devices(node, gpus_per_node)
        for s in desired_slices(node, created["metadata"]["uid"], names.DRIVER, devices, 1):
            kube.apply(
                path(RESOURCE, "resourceslices", s["metadata"]["name"]), s, PLUGIN_FIELD_MANAGER
            )
        for dev in devices:
            claim = f"{node}-{dev.name}"[:253]
            kube.create(
                path(RESOURCE, "resourceclaims", namespace=PLACEHOLDERS), placeholder_claim(claim)
            )
            kube.merge_patch(
                path(
                    RESOURCE, "resourceclaims", claim, namespace=PLACEHOLDERS, subresource="status"
                ),
                {"status": {"allocation": local_allocation(node, dev.name)}},
            )

    parallel(one, hosts)


# -- one burst --------------------------------------------------------------------------------


@dataclass
class Burst:
    claims: int
    created: dict[str, float] = field(default_factory=dict)
    ready_s: list[float] = field(default_factory=list)
    all_ready: bool = False
    bound_at_first_recheck: int = 0
    failed: int = 0
    start: float = 0.0
    end: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    stages_p50_s: dict[str, float] = field(default_factory=dict)

    def cpu_per_claim(self) -> float:
        """Controller CPU seconds per claim made ready (a burst cut short by its timeout
        is not charged for the claims it never finished)."""
        return sum(self.cpu_s.values()) / max(1, len(self.ready_s))

    def summary(self) -> JSON:
        return {
            "claims": self.claims,
            "ready": len(self.ready_s),
            "all_ready": self.all_ready,
            "ready_p50_s": round(statistics.median(self.ready_s), 3) if self.ready_s else None,
            "ready_p99_s": round(percentile(self.ready_s, 0.99), 3) if self.ready_s else None,
            "time_to_all_ready_s": round(self.end - self.start, 3),
            "bound_at_first_recheck": self.bound_at_first_recheck,
            "failed": self.failed,
            "cpu_s": {k: round(v, 2) for k, v in self.cpu_s.items()},
            "cpu_per_claim_s": round(self.cpu_per_claim(), 4),
            "stages_p50_s": self.stages_p50_s,
        }


def controller_pids(suite: Suite) -> dict[str, int]:
    return {c.name: c.proc.pid for c in suite.components if c.proc is not None}


def run_burst(suite: Suite, kube: Kube, n: int, timeout: float) -> Burst:
    ns = f"burst-{n}-{uuid.uuid4().hex[:4]}"
    kube.create(path("v1", "namespaces"), {"metadata": {"name": ns}})
    rec = Recorder(kube, ns)
    rec.start()
    pids = controller_pids(suite)
    burst = Burst(n)
    names_ = [f"c{i}" for i in range(n)]
    cpu0 = {c: cpu_seconds(p) for c, p in pids.items()}
    burst.start = time.time()
    try:
        parallel(lambda name: suite.create_claim(ns, name), names_)

        def pod(name: str) -> None:
            burst.created[name] = time.time()
            suite.create_pod(ns, name, claim=name, own_nodes=False)

        parallel(pod, names_)
        try:
            wait_for(
                lambda: len(rec.ready) + len(rec.failed) >= n,
                timeout,
                f"{n} claims to be ready",
                interval=0.5,
            )
        except AssertionError as exc:
            print(f"not every claim got ready: {exc}", flush=True)
        burst.end = time.time()
        burst.cpu_s = {c: cpu_seconds(p) - cpu0[c] for c, p in pids.items()}
        burst.all_ready = all(name in rec.ready for name in names_)
        burst.ready_s = [rec.ready[x] - burst.created[x] for x in names_ if x in rec.ready]
        burst.failed = len(rec.failed)
        # The scheduler binds at its next re-check: give the last ones that long.
        with contextlib.suppress(AssertionError):
            wait_for(lambda: len(rec.bound) >= len(rec.ready), PREBIND_POLL_S + 2, "binding")
        burst.stages_p50_s = breakdown(claim_times(burst.created, rec, {}))
        for name in names_:
            allocated = rec.stages.get(name, {}).get("allocated")
            bound = rec.bound.get(name)
            if (
                allocated is not None
                and bound is not None
                and bound - allocated < PREBIND_POLL_S + 1
            ):
                burst.bound_at_first_recheck += 1
    finally:
        rec.stop()
    return burst


# -- the whole run -------------------------------------------------------------------------


def goals(out: JSON) -> dict[str, dict[str, Any]]:
    found = {
        "all_ready": goal(out["ready"], floor=out["claims"]),
        "ready_p99_s": goal(out["ready_p99_s"], ceiling=READY_P99_CEILING_S),
        "cpu_per_claim_s": goal(out["cpu_per_claim_s"], ceiling=CPU_PER_CLAIM_CEILING_S),
        "cost_ratio_1000_vs_100": goal(out["cost_ratio_1000_vs_100"], ceiling=COST_RATIO_CEILING),
        "relists_after_start": goal(out["relists_after_start"], ceiling=0),
        "writes_per_attach": goal(
            out["writes_per_attach"]["total"], ceiling=WRITES_PER_ATTACH_CEILING
        ),
    }
    for name, mb in out["max_rss_mb"].items():
        if name != "max":
            found[f"rss_mb_{name}"] = goal(mb, ceiling=RSS_CEILING_MB)
    return found


def wake_touches(events: Iterable[JSON], start: float, end: float) -> int:
    """The pool publisher's wake-up touches (composable_dra/k8s/wake.py) between ``start`` and
    ``end`` (Unix times), from its log: one slice write each, among its writes."""
    return sum(
        1
        for e in events
        if e.get("event") == TOUCH_EVENT
        and start <= (parse_time(str(e.get("timestamp") or "")) or 0.0) < end
    )


def report(
    bursts: list[Burst],
    requests: list[Request],
    started: float,
    peak: dict[str, float],
    load: str,
    wakes: int = 0,
) -> JSON:
    """``wakes``: the publisher's wake-up touches in the last burst."""
    last = bursts[-1]
    first = bursts[0]
    per_claim = [b.cpu_per_claim() for b in bursts]
    writes = writes_by_component(requests, last.start, last.end)

    # Per attach started in the burst (a resource the scaler made): a burst cut short by
    # its timeout started fewer attaches than it has claims.
    attaches = max(1, writes.get("scaler", Counter())["create composableresources"])

    def per_claim_of(counts: Counter[str], events: bool) -> float:
        n = sum(v for k, v in counts.items() if (k == "create events") == events)
        return round(n / attaches, 2)

    per_attach = {c: per_claim_of(w, False) for c, w in sorted(writes.items())}
    events = {c: per_claim_of(w, True) for c, w in sorted(writes.items())}
    lists = lists_after(requests, started)
    relisted = full_relists(requests, started)
    relists = sum(n for c in relisted.values() for n in c.values())
    out: JSON = {
        "claims": last.claims,
        "ready": len(last.ready_s),
        "all_ready": all(b.all_ready for b in bursts),
        "ready_p50_s": last.summary()["ready_p50_s"],
        "ready_p99_s": last.summary()["ready_p99_s"],
        "cpu_per_claim_s": round(last.cpu_per_claim(), 4),
        "bound_at_first_recheck": last.bound_at_first_recheck,
        "cost_ratio_1000_vs_100": round(per_claim[-1] / per_claim[0], 3)
        if len(bursts) > 1 and per_claim[0] > 0
        else None,
        "max_rss_mb": {
            **{k: round(v, 1) for k, v in peak.items()},
            "max": round(max(peak.values()), 1),
        },
        "relists_after_start": relists,
        "relists_by_component": {c: dict(v) for c, v in sorted(relisted.items())},
        "lists_after_start": {c: dict(v) for c, v in sorted(lists.items())},
        "attaches": attaches,
        "writes_per_attach": {**per_attach, "total": round(sum(per_attach.values()), 2)},
        # Of the pool publisher's, the touches that only wake pods after a cancellation.
        "wake_writes_per_attach": round(wakes / attaches, 2),
        # Events are the humans' record, not the attach's state: counted apart.
        "events_per_attach": {**events, "total": round(sum(events.values()), 2)},
        "writes_in_burst": {c: dict(v) for c, v in sorted(writes.items())},
        "writes_needed": NEEDED_WRITES,
        "bursts": [b.summary() for b in bursts],
        "first": first.summary() if len(bursts) > 1 else None,
        "uptime": load,
    }
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_arguments(p, nodes=1000)
    p.add_argument("--claims", type=int, default=1000, help="the second, measured burst")
    p.add_argument("--first", type=int, default=100, help="the first burst (0: none)")
    p.add_argument(
        "--pool-window",
        default="auto",
        help="the pool publisher's --max-free-devices-per-pool (auto, its default: sized to "
        "the pending claims; 0: every free GPU; N: a fixed window)",
    )
    p.add_argument(
        "--fabric-poll",
        type=int,
        default=FABRIC_POLL_DEFAULT_S,
        help="the Fabric's spec.pollIntervalSeconds (%(default)s, its default; the suite's "
        "tests use 5): how often the operator and the publisher read the whole inventory",
    )
    p.add_argument(
        "--percentage-of-nodes-to-score",
        type=int,
        default=0,
        help="kube-scheduler's percentageOfNodesToScore (0, its default: adaptive)",
    )
    args = p.parse_args(argv)
    if args.first + args.claims > args.pool_gpus:
        p.error("the pool has fewer GPUs than the bursts' claims")
    return args


def main(argv: list[str] | None = None) -> int:
    """Without ``--workdir`` the control plane's files and the components' logs (about
    250 MB at 1,000 nodes) go in a temporary folder that goes with the run."""
    args = parse_args(argv)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        return run(args, args.workdir)
    with tempfile.TemporaryDirectory(prefix="scale-") as tmp:
        return run(args, Path(tmp))


def run(args: argparse.Namespace, workdir: Path) -> int:
    policy, audit_log = workdir / "audit-policy.json", workdir / "audit.log"
    policy.write_text(json.dumps(AUDIT_POLICY))
    audit = [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
    ]
    hosts = host_ids(args.nodes)
    pct = args.percentage_of_nodes_to_score
    sched = {"percentageOfNodesToScore": pct} if pct else {}
    with ControlPlane(
        find_binaries(), workdir=workdir / "cp", extra_apiserver_args=audit, scheduler_config=sched
    ) as cp:
        kube = cp.kube(pool_size=16, user_agent="bench/scale")
        opts = SuiteOptions(
            hosts=(),
            topology=fabric_topology(args.nodes, args.zones, args.pool_gpus),
            attach_latency=0.0,
            attach_timeout=max(120.0, args.timeout),
            start_timeout=600.0,
            publisher_args=[f"--max-free-devices-per-pool={args.pool_window}"],
            poll_interval_seconds=args.fabric_poll,
        )
        suite = Suite(kube, cp.kubeconfig, workdir / "suite", opts)
        t = time.monotonic()
        populate(kube, suite.suffix, hosts, args.gpus_per_node)
        setup_s = time.monotonic() - t
        # Its own client: its writes count as the plugins'.
        plugins = StandInPlugins(cp.kube(user_agent="composable-dra/plugin"))
        plugins.start()
        try:
            suite.start()
            wait_for(
                lambda: len({s["spec"]["pool"]["name"] for s in suite.pool_slices()}) >= args.zones,
                600,
                "every zone's pool",
                interval=1,
            )
            started = time.time()
            bursts = [
                run_burst(suite, kube, n, args.timeout) for n in (args.first, args.claims) if n > 0
            ]
            assert suite.publisher is not None
            wakes = wake_touches(suite.publisher.log_events(), bursts[-1].start, bursts[-1].end)
            pids = controller_pids(suite)
            peak = {c: peak_rss_mb(p) for c, p in pids.items()}
            load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        finally:
            plugins.stop()
            # The control plane is thrown away: stop the components without detaching.
            for c in suite.components:
                c.stop()
            suite.emulator.close()
    # The API server has stopped: its audit log (blocking mode) is complete.
    requests = list(parse_audit(audit_log.read_text().splitlines()))
    out = report(bursts, requests, started, peak, load, wakes)
    out["setup_s"] = round(setup_s, 1)
    out["percentage_of_nodes_to_score"] = args.percentage_of_nodes_to_score
    out["pool_window"] = args.pool_window
    out["fabric_poll_s"] = args.fabric_poll
    out["nodes"], out["zones"], out["pool_gpus"] = args.nodes, args.zones, args.pool_gpus
    return finish(out, goals(out))


if __name__ == "__main__":
    raise SystemExit(main())
