"""Remote claims: pods on nodes no fabric reaches, each with a GPU another node lends.

Starts a local control plane and, each as its own process: D donors (the plugin lending
G static GPUs with ``--lend --max-leases=M``, and ``remote-gpu-donor`` with its lease
API), the scaler (its lease controller), and C consumer nodes without GPUs (a plugin
under a kubelet emulator that runs containers as processes). Then N pods at once, spread
over the consumers, each with a claim for a remote GPU and the matmul workload
(``remote_gpu.workloads.matmul``: 1 MiB operands, ``--seconds`` of calls, every product
checked) as its container's command.

A watch on the claims records, per claim, when its allocation was seen and when
``RemoteGPUReady`` was: ``lease_ready`` is the difference (the lease controller and the
donor's share; the scheduler's PreBind re-check comes after it). It also counts, per
donor, the claims allocated its remote devices at once: a donor whose count ever passed
its ``--max-leases`` is an oversubscribed link (the scheduler enforces the donor-link
counter; this checks it did). ``goodput_GBps_per_pod`` is the median over pods of the
payload bytes their calls moved (both ways) per second spent in calls. After every pod
and claim is deleted, ``leaked_leases`` counts leases still open at the donors and token
files still on the consumers, once they had ``--settle`` seconds to go.

Goals (in ``goals``; exit status 1 when one is missed): every pod ran (exit 0, its
products right), ``oversubscribed_links`` = 0, ``leaked_leases`` = 0,
``lease_ready_p50_s`` <= 1. The last line is JSON.

    python -m hack.bench.remote_claims --pods 8 --seconds 5

``--scale-out``: instead, a pipeline stage over 1 to 8 leased GPUs behind one shaped link
at two rates, predicted against measured knee (``hack/bench/scaleout.py``; needs root).

Runs on the development machine (2 vCPUs, load average about 24 from other work, donors
without a GPU): every pod ran, no link oversubscribed (4 leases on each donor at once,
its cap), nothing leaked. ``lease_ready_p50_s`` 0.50 (p99 0.56) once the donor reused
TokenReview answers; before that 0.80 to 1.51 (p99 up to 2.0), the eight leases
becoming ready one after another on a saturated CPU. ``goodput_GBps_per_pod`` 0.004 to
0.008: eight workloads, two donors' workers and the control plane share two CPUs, so
the figure is the machine's, not the link's (one lease alone on it: 0.036 GB/s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from composable_dra.k8s.informer import Informer  # noqa: E402
from composable_dra.k8s.kube import JSON, Kube, path  # noqa: E402
from composable_dra.lending.remote_leases import (  # noqa: E402
    REMOTE_READY,
)
from hack.bench import scaleout  # noqa: E402
from hack.bench.goals import finish, goal  # noqa: E402
from hack.bench.stats import percentile_or_none  # noqa: E402
from testbed import ControlPlane  # noqa: E402
from testbed.controlplane import find_binaries  # noqa: E402
from testbed.lending import Consumer, Lab  # noqa: E402
from testbed.remote_pods import matmul_claim_and_pod  # noqa: E402
from testbed.wait import wait_for  # noqa: E402

RESOURCE = "resource.k8s.io/v1"
NAMESPACE = "bench"
DOMAIN = "bench-domain"


class ClaimWatch:
    """When each claim was allocated and got RemoteGPUReady; per donor, the claims
    allocated its remote devices at once (the most ever). Fed by an Informer's events."""

    def __init__(self, kube: Kube) -> None:
        self.allocated_at: dict[str, float] = {}
        self.ready_at: dict[str, float] = {}
        self.holding: dict[str, set[str]] = {}  # donor -> claims allocated its devices now
        self.most: dict[str, int] = {}
        self.informer = Informer(
            kube,
            path(RESOURCE, "resourceclaims", namespace=NAMESPACE),
            on_event=lambda kind, obj: self.seen(obj, kind == "DELETED", time.monotonic()),
            name="bench-claims",
        ).start()
        if not self.informer.synced.wait(30):
            raise TimeoutError("the claims were not listed within 30 s")

    def seen(self, claim: JSON, deleted: bool, at: float) -> None:
        name = claim["metadata"]["name"]
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        donors = {r["pool"] for r in results if str(r.get("device", "")).endswith("-remote")}
        for donor, names in self.holding.items():
            if deleted or donor not in donors:
                names.discard(name)
        if deleted:
            return
        for donor in donors:
            self.allocated_at.setdefault(name, at)
            held = self.holding.setdefault(donor, set())
            held.add(name)
            self.most[donor] = max(self.most.get(donor, 0), len(held))
        for st in status.get("devices") or []:
            if any(
                c.get("type") == REMOTE_READY and c.get("status") == "True"
                for c in st.get("conditions") or []
            ):
                self.ready_at.setdefault(name, at)

    def stop(self) -> None:
        self.informer.stop()


def phase(kube: Kube, name: str) -> str:
    pod = kube.get_or_none(path("v1", "pods", name, namespace=NAMESPACE)) or {}
    return str((pod.get("status") or {}).get("phase", ""))


# Long because it is the bench's one run, step after step, each using what the last made.
def run(args: argparse.Namespace, kube: Kube, cp: ControlPlane, workdir: Path) -> dict[str, Any]:
    lab = Lab(kube, cp, workdir, namespace=NAMESPACE, domain=DOMAIN)
    out: dict[str, Any] = {"pods": args.pods, "ran": 0}
    watch: ClaimWatch | None = None
    try:
        lab.start(args.donors, args.gpus, args.max_leases, args.consumers)
        watch = ClaimWatch(kube)
        names = [f"matmul-{i}" for i in range(args.pods)]
        where: dict[str, Consumer] = {}
        for i, name in enumerate(names):
            consumer = lab.consumers[i % len(lab.consumers)]
            where[name] = consumer
            # 1 MiB left operands; a narrow right one keeps the donor's CPU (no GPU here)
            # from bounding what the link carries.
            claim, pod = matmul_claim_and_pod(
                name,
                consumer.node,
                [
                    *("--size", str(args.size), "--cols", "8"),
                    *("--calls", "1", "--seconds", str(args.seconds)),
                ],
            )
            kube.create(path(RESOURCE, "resourceclaims", namespace=NAMESPACE), claim)
            kube.create(path("v1", "pods", namespace=NAMESPACE), pod)
        deadline = args.seconds * args.pods + 120
        try:
            wait_for(
                lambda: all(phase(kube, n) in ("Succeeded", "Failed") for n in names),
                deadline,
                "every pod to finish",
                interval=0.5,
            )
        except TimeoutError as exc:
            print(f"not every pod finished: {exc}", file=sys.stderr)
        lines: list[dict[str, Any]] = []
        for name in names:
            finished = kube.get_or_none(path("v1", "pods", name, namespace=NAMESPACE))
            if finished is None:
                continue
            log = where[name].kubelet.container_log(finished["metadata"]["uid"], "main")
            try:
                line = json.loads(log.strip().splitlines()[-1])
            except (IndexError, ValueError):
                print(f"{name}: no JSON line: {log[-500:]!r}", file=sys.stderr)
                continue
            if (
                phase(kube, name) == "Succeeded"
                and line.get("ok")
                and line.get("where") == "remote"
            ):
                lines.append(line)
            else:
                print(f"{name}: {line}", file=sys.stderr)
        out["ran"] = len(lines)
        waits = [
            watch.ready_at[n] - watch.allocated_at[n]
            for n in names
            if n in watch.ready_at and n in watch.allocated_at
        ]
        out["lease_ready_p50_s"] = percentile_or_none(waits, 0.5)
        out["lease_ready_p99_s"] = percentile_or_none(waits, 0.99)
        rates = [ln["bytes"] / ln["seconds"] / 1e9 for ln in lines if ln.get("seconds")]
        out["goodput_GBps_per_pod"] = round(statistics.median(rates), 4) if rates else None
        out["calls_per_pod_p50"] = statistics.median([ln["calls"] for ln in lines]) if lines else 0
        out["most_leases_per_donor"] = dict(sorted(watch.most.items()))
        out["oversubscribed_links"] = sum(1 for n in watch.most.values() if n > args.max_leases)
        for name in names:
            kube.delete(path("v1", "pods", name, namespace=NAMESPACE))
            kube.delete(path(RESOURCE, "resourceclaims", name, namespace=NAMESPACE))
        with contextlib.suppress(TimeoutError):  # what is left then is counted below
            wait_for(
                lambda: lab.open_leases() == 0 and lab.token_files() == 0,
                args.settle,
                "every lease and token file to go",
                interval=0.5,
            )
        out["leaked_leases"] = lab.open_leases() + lab.token_files()
    finally:
        if watch is not None:
            watch.stop()
        lab.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pods", type=int, default=8)
    p.add_argument("--donors", type=int, default=2)
    p.add_argument("--gpus", type=int, default=4, help="GPUs each donor lends")
    p.add_argument("--max-leases", type=int, default=4, help="each donor's link cap")
    p.add_argument("--consumers", type=int, default=4, help="fabric-less nodes")
    p.add_argument("--seconds", type=float, default=5.0, help="each pod's time of calls")
    p.add_argument("--size", type=int, default=512, help="N x N float32: 512 is 1 MiB")
    p.add_argument("--settle", type=float, default=30.0, help="seconds for leases to close")
    p.add_argument("--scale-out", action="store_true", help="the scale-out sweep instead")
    scaleout.add_arguments(p)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="rclaims-", dir="/tmp"))
    with ControlPlane(find_binaries(), workdir=workdir / "cp") as cp:
        kube = cp.kube()
        if args.scale_out:
            return scaleout.run(args, kube, cp, workdir)
        out = run(args, kube, cp, workdir)
    out["workdir"] = str(workdir)
    return finish(
        out,
        {
            "ran": goal(out["ran"], floor=args.pods),
            "oversubscribed_links": goal(out.get("oversubscribed_links"), ceiling=0),
            "leaked_leases": goal(out.get("leaked_leases"), ceiling=0),
            "lease_ready_p50_s": goal(out.get("lease_ready_p50_s"), ceiling=1.0),
        },
    )


if __name__ == "__main__":
    raise SystemExit(main())
