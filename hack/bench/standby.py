"""Time to GPU with and without a warm standby: ``python -m hack.bench.time_to_gpu --standby``.

The same run twice on one control plane, each with a fresh suite (emulator, operator, pool
publisher, scaler, a plugin and kubelet emulator per node; one zone; every attach an
asynchronous fabric task of L seconds):

1. warm-up: ``--warmup`` pods with prefer-local claims, served from the pool, keep
   running (a steady load; their claims are the recent arrivals);
2. with standby only: the Fabric's ``spec.standby`` (maxPerZone = ``--burst``, window and
   attach time equal, so K = the warm-up's arrivals, up to max) and a wait until the
   standby GPUs are attached and published as local devices;
3. the burst: ``--burst`` pods with prefer-local claims created at once; per pod, the time
   from its creation to its binding (spec.nodeName set).

Without standby every burst claim is allocated a pool device and waits for the attach
and the scheduler's 5 s binding-conditions re-check; with it, a claim that finds an idle
standby GPU on a node is allocated that local device and binds in one scheduling cycle.
``standby_idle_max``: the most GPUs the standby held idle at any moment (standby-labelled
ComposableResources that serve no claim, from a watch over the whole run), against the
policy's maxPerZone. ``bound_first_attempt``: pods bound at their first scheduling attempt
(no FailedScheduling event); ``allocated_p50_s``: created to allocated. Goals: with
standby, ``bound_p50_s`` <= 1 s, every pod bound at its first attempt and
``standby_idle_max`` <= maxPerZone; no pod failed on either side. The last line is JSON
(hack/bench/goals.py).
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from api.v1alpha1 import API_VERSION
from composable_dra.k8s.informer import Informer
from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model.names import normalize_uuid
from device_scaler.scaler import standby_held
from device_scaler.standby import STANDBY_LABEL
from hack.bench.goals import finish, goal
from hack.bench.stats import percentile
from testbed.harness import Suite, SuiteOptions
from testbed.wait import wait_for

RESOURCE = "resource.k8s.io/v1"
BOUND_P50_CEILING_S = 1.0


class Held:
    """The most standby GPUs held idle at once, by pool, from a watch of the resources."""

    def __init__(self) -> None:
        self.informer: Informer | None = None
        self.most: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, _kind: str, _obj: JSON) -> None:
        if self.informer is None:
            return
        with self._lock:
            for pool, n in standby_held(self.informer.items()).items():
                self.most[pool] = max(self.most.get(pool, 0), n)


class Bound:
    """When each pod of the namespace was first seen bound, and each claim allocated."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.allocated: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, _kind: str, pod: JSON) -> None:
        if (pod.get("spec") or {}).get("nodeName"):
            with self._lock:
                self.at.setdefault(pod["metadata"]["name"], time.time())

    def claim(self, _kind: str, claim: JSON) -> None:
        if (claim.get("status") or {}).get("allocation"):
            with self._lock:
                self.allocated.setdefault(claim["metadata"]["name"], time.time())


def policy(burst: int, window: int) -> JSON:
    return {"maxPerZone": burst, "minPerZone": 0, "windowSeconds": window, "attachSeconds": window}


def free_standby(suite: Suite) -> int:
    """Standby GPUs Online, published by their node as a local device, allocated to nobody."""
    standby = {
        normalize_uuid(r["status"]["deviceUUID"]): r["spec"]["targetNode"]
        for r in suite.resources()
        if STANDBY_LABEL in r["metadata"].get("labels", {})
        and (r.get("status") or {}).get("phase") == "Online"
        and r["status"].get("deviceUUID")
    }
    claims = suite.kube.get(path(RESOURCE, "resourceclaims"))["items"]
    taken = {
        (r.get("pool"), r.get("device"))
        for c in claims
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        )
        or []
    }
    n = 0
    for host in suite.nodes:
        node = suite.node_of(host)
        for d in suite.local_devices(host):
            uuid = normalize_uuid(str(d["attributes"]["uuid"]["string"]))
            n += standby.get(uuid) == node and (node, d["name"]) not in taken
    return n


def burst_result(
    suite: Suite, ns: str, burst: list[str], created: dict[str, float], bound: Bound, held: Held
) -> dict[str, Any]:
    """How fast the burst's pods were bound, and where their GPUs came from."""
    times = [bound.at[n] - t0 for n, t0 in created.items() if n in bound.at]
    local = 0
    for name in burst:
        results = (
            ((suite.claim(ns, name).get("status") or {}).get("allocation") or {}).get("devices")
            or {}
        ).get("results") or []
        local += any("/" not in str(r.get("pool")) for r in results)
    failed = sum(1 for n in burst if not suite.running(ns, n))
    # Bound at the first scheduling attempt: no FailedScheduling event (a pool claim's
    # PreBind wait that outlasts the binding timeout, a taken block, a backoff).
    first_attempt = sum(
        1
        for n in burst
        if n in bound.at
        and not any(e.get("reason") == "FailedScheduling" for e in suite.pod_events(ns, n))
    )
    to_alloc = [bound.allocated[n] - t0 for n, t0 in created.items() if n in bound.allocated]
    p50 = statistics.median(times) if times else None
    p99 = percentile(times, 0.99) if times else None
    return {
        "bound_p50_s": round(p50, 3) if p50 is not None else None,
        "bound_p99_s": round(p99, 3) if p99 is not None else None,
        "bound_max_s": round(max(times), 3) if times else None,
        "allocated_p50_s": round(statistics.median(to_alloc), 3) if to_alloc else None,
        "allocated_local": local,
        "bound_first_attempt": first_attempt,
        "failed": failed,
        "standby_idle_max": max(held.most.values(), default=0),
    }


def one_side(
    kube: Kube, kubeconfig: Path, opts: SuiteOptions, args: Any, with_standby: bool
) -> dict[str, Any]:
    side = "with" if with_standby else "without"
    workdir = Path(tempfile.mkdtemp(prefix=f"sb-{side}-", dir="/tmp"))
    suite = Suite(kube, kubeconfig, workdir, opts).start()
    ns = f"standby-{side}"
    kube.create(path("v1", "namespaces"), {"metadata": {"name": ns}})
    held, bound = Held(), Bound()
    resources = Informer(kube, path(API_VERSION, "composableresources"), on_event=held)
    held.informer = resources
    pods = Informer(kube, path("v1", "pods", namespace=ns), on_event=bound)
    claims = Informer(kube, path(RESOURCE, "resourceclaims", namespace=ns), on_event=bound.claim)
    out: dict[str, Any] = {}
    try:
        resources.start()
        pods.start()
        claims.start()
        if with_standby:
            suite.kube.merge_patch(
                path(API_VERSION, "fabrics", suite.fabric),
                {"spec": {"standby": policy(args.burst, args.window)}},
            )
        warm = [f"w{i}" for i in range(args.warmup)]
        for name in warm:
            suite.create_pod(ns, name)
        wait_for(
            lambda: all(suite.running(ns, n) for n in warm),
            args.timeout,
            "the warm-up pods to run",
            describe=suite.describe,
        )
        if with_standby:
            want = min(args.burst, args.warmup)
            wait_for(
                lambda: free_standby(suite) >= want,
                args.timeout,
                f"{want} standby GPUs attached and published as local devices",
                describe=suite.describe,
            )
        burst = [f"b{i}" for i in range(args.burst)]
        for name in burst:
            suite.create_claim(ns, name)
        created: dict[str, float] = {}
        for name in burst:
            created[name] = time.time()
            suite.create_pod(ns, name, claim=name)
        try:
            wait_for(
                lambda: all(suite.running(ns, n) for n in burst),
                args.timeout,
                "the burst's pods to run",
            )
        except TimeoutError as exc:
            print(f"{side} standby: not all pods ran: {exc}")
        out = burst_result(suite, ns, burst, created, bound, held)
        print(f"{side} standby: {out}", flush=True)
    finally:
        pods.stop()
        claims.stop()
        resources.stop()
        suite.stop()
    return out


def run(args: Any, kube: Kube, kubeconfig: Path, opts: SuiteOptions) -> int:
    without = one_side(kube, kubeconfig, opts, args, with_standby=False)
    with_ = one_side(kube, kubeconfig, opts, args, with_standby=True)
    out: dict[str, Any] = {
        "burst": args.burst,
        "warmup": args.warmup,
        "attach_latency_s": args.attach_latency,
        "policy": policy(args.burst, args.window),
        "without_standby": without,
        "with_standby": with_,
        "bound_p50_s": with_["bound_p50_s"],
        "bound_p99_s": with_["bound_p99_s"],
        "standby_idle_max": with_["standby_idle_max"],
        "standby_max_per_zone": args.burst,
    }
    return finish(out, goals(with_, without, args.burst, args.burst))


def goals(
    with_: dict[str, Any], without: dict[str, Any], max_per_zone: int, burst: int
) -> dict[str, dict[str, Any]]:
    return {
        "bound_p50_s": goal(with_["bound_p50_s"], ceiling=BOUND_P50_CEILING_S),
        "bound_first_attempt": goal(with_["bound_first_attempt"], floor=burst),
        "standby_idle_max": goal(with_["standby_idle_max"], ceiling=max_per_zone),
        "failed_with_standby": goal(with_["failed"], ceiling=0),
        "failed_without_standby": goal(without["failed"], ceiling=0),
    }
