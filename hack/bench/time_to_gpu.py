"""Time to GPU: N claims arriving together, each needing a pool GPU attached with latency L.

Starts a local control plane and the whole suite (testbed/harness.py: emulator,
operator, pool publisher, scaler, a plugin and kubelet emulator per node), then creates N
pods with their claims at once. Informers record, per pod, when it was bound (spec.nodeName
set) and when its claim got FabricDeviceReady; the emulator runs every attach as an
asynchronous task that takes L seconds (Redfish task monitor, Retry-After 1 s).

    overhead   = bound - created - L            (the issue's definition)
    ready      = FabricDeviceReady - created - L (the suite's own share: allocation,
                                                  scaler, operator, plugin visibility)

The difference between the two is the scheduler's PreBind wait: kube-scheduler v1.37
re-checks binding conditions every 5 s (a fixed poll in the DynamicResources plugin), so a
pod is bound at the first 5 s tick after its claim is ready, and the overhead cannot go
below (allocated - created) + 5 - L: ``overhead_floor_s``. ``bound_at_first_recheck``
counts the pods whose claim was ready in time for that first tick; ``stages_p50_s`` is
the median of each step (scheduler, scaler, operator and fabric, plugin, operator,
scaler; the operator's own steps from its log lines), and ``shares_s`` the p50 and p99 of
each party's share of the time to FabricDeviceReady: ``scheduler`` (created to
allocated), ``scaler`` (to the ComposableResource), ``operator_before_send`` (to the
composition request), ``fabric`` (to the attach read back; includes L) and
``after_fabric`` (Attached, the plugin's DeviceVisible, Online, the scaler's
FabricDeviceReady).

``pods_failed_scheduling`` counts the pods with a FailedScheduling event (no GPU they
could have when the scheduler tried them: a pool window emptied by the claims before it);
``--pool-window`` sets the publisher's window (default: its own, ``auto``).

A pod counts as rescheduled when its claim's allocation changed or was removed before the
pod was bound, or when it got more than one Scheduled event; failed when it did not run by
the deadline or its claim saw FabricDeviceFailed. ``shared_gpus`` counts physical GPUs
that two claims were allocated at once (as a pool device and as a node's local device).

Goals, in ``goals`` with the figure, its floor or ceiling and whether it was met;
the exit status is 1 when any is missed: ``failed`` = 0, ``shared_gpus`` = 0 and
``bound_at_first_recheck`` = ``claims`` at any size; the suite's own share
``ready_overhead_p50_s`` <= 0.5 s up to 20 claims and ``ready_overhead_p99_s`` <= 3 s up to
100 claims. The last line is JSON.

    python -m hack.bench.time_to_gpu --claims 20 --attach-latency 2
    python -m hack.bench.time_to_gpu --standby   # with and without a warm standby
                                                 # (hack/bench/standby.py)
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import Kube, path
from composable_dra.model import names
from dra_driver.device_source import device_name_for
from hack.bench.goals import finish, goal
from hack.bench.stats import percentile
from testbed import ControlPlane
from testbed.controlplane import find_binaries
from testbed.harness import Suite, SuiteOptions


def topology(hosts: int, blocks: int) -> dict[str, Any]:
    ids = [f"node-{i + 1}" for i in range(hosts)]
    return {
        "hosts": [{"id": h} for h in ids],
        "zones": [
            {
                "id": "zone-1",
                "hosts": ids,
                "blocks": [
                    {"id": f"gpu-{i + 1}", "model": "NVIDIA H100 80GB HBM3"} for i in range(blocks)
                ],
            }
        ],
    }


class Recorder:
    """Watches pods and claims of the namespace and notes first-seen times."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.ns = kube, namespace
        self.bound: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.failed: set[str] = set()
        self.allocations: dict[str, list[Any]] = {}
        self.resource_claim: dict[str, str] = {}  # ComposableResource -> its claim
        # First-seen times of each stage of a claim's attach, for the breakdown.
        self.stages: dict[str, dict[str, float]] = {}
        self._lock = threading.Lock()
        self.informers = [
            Informer(
                kube,
                path(api, plural, namespace=None if plural == "composableresources" else self.ns),
                on_event=functools.partial(self._event, plural),
                name=plural,
                watch_timeout=30,
            )
            for api, plural in (
                ("v1", "pods"),
                ("resource.k8s.io/v1", "resourceclaims"),
                (API_VERSION, "composableresources"),
            )
        ]

        self.pods = self.informers[0]

    def start(self) -> None:
        for inf in self.informers:
            inf.start()

    def stop(self) -> None:
        for inf in self.informers:
            inf.stop()

    def _event(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            with self._lock:  # one informer thread per kind
                self._see(plural, obj)

    def _stage(self, claim: str, stage: str, now: float) -> None:
        self.stages.setdefault(claim, {}).setdefault(stage, now)

    def _see(self, plural: str, obj: dict[str, Any]) -> None:
        now = time.time()
        name = obj["metadata"]["name"]
        if plural == "composableresources":
            ref = (obj.get("spec") or {}).get("claimRef") or {}
            if ref.get("namespace") != self.ns or not ref.get("name"):
                return
            claim = str(ref["name"])
            self.resource_claim[name] = claim
            self._stage(claim, "resource", now)
            status = obj.get("status") or {}
            if status.get("phase") == "Online":
                self._stage(claim, "online", now)
            for c in status.get("conditions") or []:
                if c.get("status") != "True":
                    continue
                if c.get("type") == names.ATTACHED:
                    self._stage(claim, "attached", now)
                if c.get("type") == names.DEVICE_VISIBLE:
                    self._stage(claim, "visible", now)
            return
        if plural == "pods":
            if obj["spec"].get("nodeName") and name not in self.bound:
                self.bound[name] = now
            return
        status = obj.get("status") or {}
        alloc = status.get("allocation")
        results = (alloc or {}).get("devices", {}).get("results", [])
        key = [(r.get("pool"), r.get("device")) for r in results]
        history = self.allocations.setdefault(name, [])
        if not history or history[-1] != key:
            history.append(key)
        if results:
            self._stage(name, "allocated", now)
        for dev in status.get("devices") or []:
            for c in dev.get("conditions") or []:
                if c.get("status") != "True":
                    continue
                if c.get("type") == names.FABRIC_DEVICE_READY and name not in self.ready:
                    self.ready[name] = now
                if c.get("type") == names.FABRIC_DEVICE_FAILED:
                    self.failed.add(name)


def running(pods: list[dict[str, Any]]) -> set[str]:
    return {
        p["metadata"]["name"] for p in pods if (p.get("status") or {}).get("phase") == "Running"
    }


PREBIND_POLL_S = 5  # kube-scheduler's fixed re-check of binding conditions

# (stage, previous stage): the breakdown reports the median of each step's duration.
STEPS = (
    ("allocated", "created"),  # scheduler: pool device allocated, PreBind started
    ("resource", "allocated"),  # scaler: ComposableResource created
    ("attached", "resource"),  # operator + fabric: attached (includes L)
    ("visible", "attached"),  # plugin: the GPU found on the node, DeviceVisible
    ("online", "visible"),  # operator: Online
    ("ready", "online"),  # scaler: FabricDeviceReady on the claim
    ("bound", "ready"),  # scheduler: PreBind's next binding-conditions check
)


# The operator's log lines of an attach's steps (composable_operator/actions.py,
# controller.py) -> the stage each marks, for the time between the resource and Attached.
OPERATOR_STEPS = {
    "attaching": "sent",  # the composition request goes to the fabric
    "attach answered": "answered",  # the fabric answered (a task, or done)
    "attached; awaiting the node": "op_attached",  # the task ended and the block was read
}

# Where a claim's time to FabricDeviceReady goes, by who spends it: (name, from, to).
SHARES = (
    ("scheduler", "created", "allocated"),
    ("scaler", "allocated", "resource"),
    ("operator_before_send", "resource", "sent"),
    ("fabric", "sent", "op_attached"),  # includes L
    ("after_fabric", "op_attached", "ready"),  # Attached written, plugin, Online, scaler
)


def operator_steps(log: Path | None) -> dict[str, dict[str, float]]:
    """ComposableResource -> stage -> first time the operator's log shows it."""
    out: dict[str, dict[str, float]] = {}
    if log is None or not log.exists():
        return out
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        stage = OPERATOR_STEPS.get(str(rec.get("event")))
        if stage is None or "resource" not in rec or "timestamp" not in rec:
            continue
        at = datetime.fromisoformat(str(rec["timestamp"]).replace("Z", "+00:00")).timestamp()
        out.setdefault(str(rec["resource"]), {}).setdefault(stage, at)
    return out


def claim_times(
    created: dict[str, float], rec: Recorder, operator: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Claim -> every stage's first time: the bench's watches and the operator's log."""
    from_log: dict[str, dict[str, float]] = {}
    for resource, stages in operator.items():
        claim = rec.resource_claim.get(resource)
        if claim is not None:
            from_log[claim] = stages
    out = {}
    for name, t0 in created.items():
        seen = {"created": t0, **from_log.get(name, {}), **rec.stages.get(name, {})}
        if name in rec.ready:
            seen["ready"] = rec.ready[name]
        if name in rec.bound:
            seen["bound"] = rec.bound[name]
        out[name] = seen
    return out


def steps_of(
    times: dict[str, dict[str, float]], steps: tuple[tuple[str, str, str], ...]
) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for seen in times.values():
        for label, prev, stage in steps:
            if stage in seen and prev in seen:
                found.setdefault(label, []).append(seen[stage] - seen[prev])
    return found


def breakdown(times: dict[str, dict[str, float]]) -> dict[str, float]:
    fine = tuple((f"{prev}->{stage}", prev, stage) for stage, prev in STEPS)
    fine += (
        ("resource->sent", "resource", "sent"),
        ("sent->answered", "sent", "answered"),
        ("answered->op_attached", "answered", "op_attached"),
    )
    steps = steps_of(times, fine)
    return {k: round(statistics.median(v), 3) for k, v in steps.items()}


def shares(times: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each party's share of the time to FabricDeviceReady: p50 and p99 over the claims."""
    return {
        k: {"p50": round(statistics.median(v), 3), "p99": round(percentile(v, 0.99), 3)}
        for k, v in steps_of(times, SHARES).items()
    }


def shared_gpus(
    allocations: dict[str, list[tuple[str, str]]], block_uuids: dict[str, str]
) -> dict[str, list[str]]:
    """Physical GPU (block) -> the claims allocated it, where more than one is.

    ``allocations``: claim -> its (pool, device) results; a pool device is named after its
    block, a node's local device after its UUID (``device_name_for``).
    """
    by_local_name = {device_name_for(u): b for b, u in block_uuids.items()}
    holders: dict[str, list[str]] = {}
    for claim, results in sorted(allocations.items()):
        for pool, device in results:
            block = device if "/" in pool else by_local_name.get(device, f"{pool}/{device}")
            holders.setdefault(block, []).append(f"{claim} ({pool}/{device})")
    return {b: claims for b, claims in holders.items() if len(claims) > 1}


def goals(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each goal that applies at this size."""
    claims = int(out["claims"])
    found = {
        "failed": goal(out["failed"], ceiling=0),
        "shared_gpus": goal(out["shared_gpus"], ceiling=0),
        "bound_at_first_recheck": goal(out["bound_at_first_recheck"], floor=claims),
    }
    if claims <= 20:
        found["ready_overhead_p50_s"] = goal(out["ready_overhead_p50_s"], ceiling=0.5)
    if claims <= 100:
        found["ready_overhead_p99_s"] = goal(out["ready_overhead_p99_s"], ceiling=3.0)
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--claims", type=int, default=20)
    p.add_argument(
        "--attach-latency",
        type=int,
        default=2,
        help="L, seconds: the fabric runs each attach as a task that ends after L polls, "
        "one a second (Retry-After: 1), as a fabric manager would",
    )
    p.add_argument(
        "--request-latency",
        type=float,
        default=0.0,
        help="extra seconds on every composition request itself (added to L)",
    )
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument(
        "--pool-window",
        default="auto",
        help="the pool publisher's --max-free-devices-per-pool (auto: its default)",
    )
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument(
        "--standby",
        action="store_true",
        help="the same burst with and without a warm standby (hack/bench/standby.py)",
    )
    p.add_argument("--burst", type=int, default=8, help="--standby: pods in the burst")
    p.add_argument("--warmup", type=int, default=8, help="--standby: steady pods before it")
    p.add_argument("--window", type=int, default=120, help="--standby: the policy's window")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.standby:
        return standby_bench(args)

    with ControlPlane(find_binaries()) as cp:
        kube = cp.kube()
        workdir = Path(tempfile.mkdtemp(prefix="ttg-", dir="/tmp"))
        opts = SuiteOptions(
            hosts=tuple(f"node-{i + 1}" for i in range(args.hosts)),
            topology=topology(args.hosts, args.claims + 4),
            async_polls=args.attach_latency,
            retry_after=1 if args.attach_latency else 0,
            attach_latency=args.request_latency,
            attach_timeout=max(60.0, 10.0 * (args.attach_latency + args.request_latency)),
            publisher_args=[f"--max-free-devices-per-pool={args.pool_window}"],
        )
        suite = Suite(kube, cp.kubeconfig, workdir, opts).start()
        ns = "bench"
        kube.create(path("v1", "namespaces"), {"metadata": {"name": ns}})
        rec = Recorder(kube, ns)
        rec.start()
        created: dict[str, float] = {}
        try:
            for i in range(args.claims):
                suite.create_claim(ns, f"c{i}")
            for i in range(args.claims):
                created[f"c{i}"] = time.time()
                suite.create_pod(ns, f"c{i}", claim=f"c{i}")
            try:
                rec.pods.wait_for(lambda pods: running(pods) >= set(created), args.timeout)
            except TimeoutError as exc:
                print(f"not all pods ran: {exc}")
            out = measure(args, suite, rec, created)
        finally:
            rec.stop()
            suite.stop()
    return finish(out, goals(out))


def measure(
    args: argparse.Namespace, suite: Suite, rec: Recorder, created: dict[str, float]
) -> dict[str, Any]:
    """The bench's result: each claim's overheads over the fabric's latency, its stages,
    and what went wrong (rescheduled, failed, a GPU given to two claims)."""
    kube, ns = suite.kube, rec.ns
    latency = args.attach_latency + args.request_latency
    overhead, ready = [], []
    rescheduled = failed = first_recheck = failed_scheduling = 0
    to_alloc: list[float] = []
    for name, t0 in created.items():
        allocated = rec.stages.get(name, {}).get("allocated")
        if allocated is not None:
            to_alloc.append(allocated - t0)
            bound = rec.bound.get(name)
            if bound is not None and bound - allocated < PREBIND_POLL_S + 1:
                first_recheck += 1
        if name in rec.bound:
            overhead.append(rec.bound[name] - t0 - latency)
        if name in rec.ready:
            ready.append(rec.ready[name] - t0 - latency)
        history = [h for h in rec.allocations.get(name, []) if h]
        events = suite.pod_events(ns, name)
        scheduled = [e for e in events if e.get("reason") == "Scheduled"]
        # A pod that found no GPU it could have (a pool window emptied) and waited.
        failed_scheduling += any(e.get("reason") == "FailedScheduling" for e in events)
        if len(history) > 1 or len(scheduled) > 1:
            rescheduled += 1
        if name in rec.failed or not suite.running(ns, name):
            failed += 1
    op_log = suite.operator.log_path if suite.operator is not None else None
    times = claim_times(created, rec, operator_steps(op_log))
    out: dict[str, Any] = {
        "claims": args.claims,
        "attach_latency_s": latency,
        "overhead_p50_s": round(statistics.median(overhead), 3) if overhead else None,
        "overhead_p99_s": round(percentile(overhead, 0.99), 3) if overhead else None,
        "ready_overhead_p50_s": round(statistics.median(ready), 3) if ready else None,
        "ready_overhead_p99_s": round(percentile(ready, 0.99), 3) if ready else None,
        "pods_failed_scheduling": failed_scheduling,
        "pool_window": args.pool_window,
        "scheduler_prebind_poll_s": PREBIND_POLL_S,
        # The least overhead kube-scheduler allows once an attach takes longer
        # than its immediate check: allocation, then one 5 s re-check, minus L.
        "overhead_floor_s": round(statistics.median(to_alloc) + PREBIND_POLL_S - latency, 3)
        if to_alloc
        else None,
        "bound_at_first_recheck": first_recheck,
        "rescheduled": rescheduled,
        "failed": failed,
        "shared_gpus": len(shared_gpus(final_allocations(kube, ns), block_uuids(suite))),
        "stages_p50_s": breakdown(times),
        "shares_s": shares(times),
    }
    return out


def standby_bench(args: argparse.Namespace) -> int:
    """``--standby``: one control plane, a fresh suite for each side (hack/bench/standby.py)."""
    from hack.bench import standby

    with ControlPlane(find_binaries()) as cp:
        kube = cp.kube()
        opts = SuiteOptions(
            hosts=tuple(f"node-{i + 1}" for i in range(args.hosts)),
            topology=topology(args.hosts, args.warmup + 2 * args.burst + 4),
            async_polls=args.attach_latency,
            retry_after=1 if args.attach_latency else 0,
            attach_latency=args.request_latency,
            attach_timeout=max(60.0, 10.0 * (args.attach_latency + args.request_latency)),
        )
        return standby.run(args, kube, cp.kubeconfig, opts)


def final_allocations(kube: Kube, ns: str) -> dict[str, list[tuple[str, str]]]:
    claims = kube.get(path("resource.k8s.io/v1", "resourceclaims", namespace=ns))["items"]
    return {
        c["metadata"]["name"]: [
            (str(r.get("pool")), str(r.get("device")))
            for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            )
            or []
        ]
        for c in claims
    }


def block_uuids(suite: Suite) -> dict[str, str]:
    return {b: str(v.get("uuid", "")) for b, v in suite.emulator.state()["blocks"].items()}


if __name__ == "__main__":
    raise SystemExit(main())
