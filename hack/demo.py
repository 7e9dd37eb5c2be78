"""The local demo: a real control plane, the mocked fabric and the whole suite.

Run with `make demo` (or `python -m hack.demo --help`). It starts etcd and the
Kubernetes control plane, the Redfish fabric emulator (3 hosts, 2 zones, 8 GPUs), three
nodes with a plugin each, and the operator, the pool publisher and the scaler, each as its
own process, as the product runs them. The nodes are real (the upstream kubelet with
containerd and runc, testbed/realnode.py) where the machine allows it (root,
the node binaries built or cached by hack/node/build.sh), otherwise kubelet emulators; the
demo says which, and why. It then applies the
examples of deploy/examples, shows the attach flow as it happens, releases one GPU and
waits until it goes back to the pool. Last, the software fallback: a node that no fabric
reaches borrows a donor node's GPU (testbed/lending.py: both nodes kubelet
emulators, the donor's lease API, the scaler's lease controller), and the pod's own
process runs matmul on the donor and checks the products. It prints a JSON summary as
its last line, with ``remote``: the donor, the lease, the transport and whether the
products were right.

With --chart (root, real nodes only) the product is installed by its Helm chart instead,
once, with lending on (testbed/chart_demo.py): every component and the fabric emulator are
the chart's pods on three real nodes the fabric reaches, and a fourth node lends its GPU
through the chart's plugin-lend and donor DaemonSets. The same steps run on it; in the
remote one a fabric node joins the donor's network domain and its pod (the product's
image) runs matmul on the donor's GPU, the chart's scaler running the lease controller: no
component runs as a process of the demo. The JSON's ``installed_by`` says which
(``"helm"``, else ``"process"``).

The cluster stays up afterwards (kubeconfig printed; Ctrl-C stops it), or is torn down
at once with --teardown.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.lending.remote_leases import REMOTE_READY
from composable_dra.process import logs
from testbed import ControlPlane, examples
from testbed import chart_lend as lend
from testbed.chart_cluster import workload_namespace
from testbed.chart_demo import DemoLending, demo_suite
from testbed.controlplane import find_binaries
from testbed.harness import Suite, SuiteOptions
from testbed.lending import Lab
from testbed.realnode import RealNode, RealNodeError, find_node_binaries
from testbed.realnode_pods import for_real_node
from testbed.remote_pods import matmul_claim_and_pod
from testbed.testimage import IMAGE
from testbed.wait import wait_for

EXAMPLES = ("pool-only", "prefer-local-fallback-pool", "two-gpus", "shared-claim")
NAMESPACE = "demo"
REMOTE_NAMESPACE = "demo-remote"
RESOURCE = "resource.k8s.io/v1"


class Cluster(Protocol):
    """What the demo reads of its cluster: testbed.harness.Suite (each component a
    process) or testbed.chart_cluster.ChartSuite (the chart's pods)."""

    kube: Kube

    @property
    def real_nodes(self) -> dict[str, RealNode]: ...

    def resources(self) -> list[JSON]: ...

    def pool_slices(self) -> list[JSON]: ...

    def pod(self, namespace: str, name: str) -> JSON: ...

    def running(self, namespace: str, name: str) -> bool: ...

    def describe(self) -> str: ...


class Progress:
    """What a person watching should see: stages, and each change of the flow."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def line(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    @contextmanager
    def stage(self, title: str) -> Iterator[None]:
        start = time.monotonic()
        print(f"\n==> {title}", flush=True)
        yield
        print(f"    ({time.monotonic() - start:.1f}s)", flush=True)


class Watcher:
    """Prints claims, ComposableResources and pods as their state changes (polled)."""

    def __init__(self, suite: Cluster, out: Progress) -> None:
        self.suite, self.out = suite, out
        self.seen: dict[str, str] = {}
        self.running_at: dict[str, float] = {}
        self.created_at: dict[str, float] = {}
        self.attached: set[str] = set()
        self.detached: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _report(self, key: str, state: str, text: str) -> None:
        if self.seen.get(key) != state:
            self.seen[key] = state
            self.out.line(text)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):  # a display refresh, not a synchronisation
            try:
                self.poll()
            except Exception as exc:
                self.out.line(f"(watch: {exc})")

    def poll(self) -> None:
        with self._lock:  # the display thread and the stages both poll
            self._poll()

    def _poll(self) -> None:
        kube = self.suite.kube
        for claim in kube.get(path("resource.k8s.io/v1", "resourceclaims", namespace=NAMESPACE))[
            "items"
        ]:
            name = claim["metadata"]["name"]
            status = claim.get("status") or {}
            results = (status.get("allocation") or {}).get("devices", {}).get("results", [])
            if results:
                where = ", ".join(f"{r['pool']}/{r['device']}" for r in results)
                self._report(f"claim/{name}", "allocated", f"claim {name}: allocated {where}")
            for d in status.get("devices", []):
                for c in d.get("conditions", []):
                    if c["status"] == "True":
                        self._report(
                            f"claim/{name}/{d['device']}",
                            c["type"],
                            f"claim {name}: {c['type']} for {d['device']}"
                            + (f" (GPU {d.get('data', {}).get('uuid')})" if d.get("data") else ""),
                        )
        for r in self.suite.resources():
            name, phase = r["metadata"]["name"], (r.get("status") or {}).get("phase") or "Pending"
            if phase == "Online":
                self.attached.add(name)
            who = (
                f"for claim {r['spec']['claimRef']['name']}"
                if r["spec"].get("claimRef")
                else "idle"
            )
            self._report(
                f"cr/{name}",
                f"{phase}/{who}",
                f"ComposableResource {name}: {phase} ({r['spec']['deviceID']} → "
                f"{r['spec']['targetNode']}, {who})",
            )
        for cr_name in list(self.attached):
            if (
                kube.get_or_none(path("composable.dra.io/v1alpha1", "composableresources", cr_name))
                is None
            ) and cr_name not in self.detached:
                self.detached.add(cr_name)
                self.out.line(f"ComposableResource {cr_name}: detached, GPU back in the pool")
        for pod in kube.get(path("v1", "pods", namespace=NAMESPACE))["items"]:
            name = pod["metadata"]["name"]
            phase = (pod.get("status") or {}).get("phase", "Pending")
            node = pod["spec"].get("nodeName") or "-"
            self.created_at.setdefault(name, time.monotonic())
            if phase == "Running":
                self.running_at.setdefault(name, time.monotonic())
            self._report(f"pod/{name}", f"{phase}/{node}", f"pod {name}: {phase} (node {node})")


def pool_summary(suite: Cluster) -> list[str]:
    lines = []
    for s in suite.pool_slices():
        spec = s["spec"]
        nodes = [
            v
            for t in spec.get("nodeSelector", {}).get("nodeSelectorTerms", [])
            for e in t.get("matchExpressions", [])
            for v in e.get("values", [])
        ]
        lines.append(
            f"pool {spec['pool']['name']}: {len(spec.get('devices', []))} free GPUs, "
            f"reaching {', '.join(sorted(nodes))}"
        )
    return lines


def real_node_binaries(choice: str) -> tuple[Path | None, str]:
    """The node binaries when the demo's nodes are to be real, and why (not)."""
    if choice == "emulator":
        return None, "--nodes=emulator"
    if os.geteuid() != 0:
        reason = "not root (a real node needs mount namespaces and runc)"
    else:
        try:
            return find_node_binaries(), "root, node binaries and runc present"
        except RealNodeError as exc:
            reason = str(exc)
    if choice == "real":
        raise SystemExit(f"--nodes=real: {reason}")
    return None, reason


def containers_ran(suite: Cluster, pods: list[str]) -> int:
    """Pods whose container a real runtime started (containerd), not an emulator."""
    count = 0
    for name in pods:
        statuses = suite.pod(NAMESPACE, name).get("status", {}).get("containerStatuses", [])
        count += any(str(c.get("containerID", "")).startswith("containerd://") for c in statuses)
    return count


def container_output(suite: Cluster, pod: str) -> str:
    node = suite.pod(NAMESPACE, pod)["spec"].get("nodeName")
    real = next((r for r in suite.real_nodes.values() if r.name == node), None)
    if real is None:
        return "(not on a real node)"
    container = suite.pod(NAMESPACE, pod)["spec"]["containers"][0]["name"]
    return " | ".join(real.container_log(NAMESPACE, pod, container).split("\n")[:2]).strip()


def remote_lease(stop_scaler: Callable[[], None], lab: Lab, out: Progress) -> dict[str, Any]:
    """One remote lease, shown: a pod on a GPU-less node runs matmul on a donor's GPU."""
    # One scaler at a time: the lab's scaler (pool path and lease controller) takes over.
    stop_scaler()
    lab.start(donors=1, gpus=1, max_leases=2, consumers=1)
    default_sa = path("v1", "serviceaccounts", "default", namespace=REMOTE_NAMESPACE)
    wait_for(lambda: lab.kube.get_or_none(default_sa), 60, "the remote namespace's account")
    donor, consumer = lab.donors[0], lab.consumers[0]
    out.line(
        f"donor {donor.node} lends 1 GPU (lease API {donor.api_url}); {consumer.node} has none"
    )
    claim, pod = matmul_claim_and_pod("remote-matmul", consumer.node, ["--calls", "8"])
    kube = lab.kube
    kube.create(path(RESOURCE, "resourceclaims", namespace=REMOTE_NAMESPACE), claim)
    created = time.monotonic()
    kube.create(path("v1", "pods", namespace=REMOTE_NAMESPACE), pod)

    def phase() -> str:
        got = kube.get_or_none(path("v1", "pods", "remote-matmul", namespace=REMOTE_NAMESPACE))
        return str(((got or {}).get("status") or {}).get("phase", ""))

    # The claim's device status goes with its allocation once the pod is done: keep what
    # RemoteGPUReady said while it was there.
    ready: JSON = {}

    def done() -> bool:
        claim = kube.get_or_none(
            path(RESOURCE, "resourceclaims", "remote-matmul", namespace=REMOTE_NAMESPACE)
        )
        for dev in ((claim or {}).get("status") or {}).get("devices") or []:
            if any(c.get("type") == REMOTE_READY for c in dev.get("conditions") or []):
                ready.update(dev)
        return phase() in ("Succeeded", "Failed")

    wait_for(done, 120, "the remote pod", describe=lab.describe)
    took = time.monotonic() - created
    uid = kube.get(path("v1", "pods", "remote-matmul", namespace=REMOTE_NAMESPACE))["metadata"][
        "uid"
    ]
    printed = consumer.kubelet.container_log(uid, "main").strip().splitlines()
    result: JSON = json.loads(printed[-1]) if printed else {}
    return remote_summary(out, phase(), result, ready, took)


def remote_summary(
    out: Progress, phase: str, result: JSON, ready: JSON, took: float
) -> dict[str, Any]:
    """The remote step's JSON block, from the pod's phase, the workload's last line
    (``result``) and the claim's device status at RemoteGPUReady (``ready``)."""
    data = ready.get("data") or {}
    out.line(
        f"claim: {REMOTE_READY} on {ready.get('device')} "
        f"(donor {data.get('donor')}, lease {data.get('lease')})"
    )
    out.line(f"the pod's own process printed: {json.dumps(result) if result else '(nothing)'}")
    return {
        "ok": phase == "Succeeded" and bool(result.get("ok")) and bool(data.get("donor")),
        "donor": data.get("donor"),
        "lease": data.get("lease"),
        "transport": result.get("transport"),
        "calls": result.get("calls"),
        "pod_done_s": round(took, 2),
    }


def chart_remote_lease(lending: DemoLending, out: Progress) -> dict[str, Any]:
    """The same lease through the chart: the borrower's pod runs matmul on the GPU the
    donor node's chart pods lend; the chart's scaler opens the lease."""
    donor, borrower = lending.donor, lending.borrower
    workload_namespace(lending.kube, REMOTE_NAMESPACE)
    out.line(
        f"donor {donor.name} lends 1 GPU (lease API https://{lend.address(donor)}:"
        f"{lend.API_PORT}); {borrower.name} joins its network domain and borrows it"
    )
    created = time.monotonic()
    run = lending.lease(REMOTE_NAMESPACE, ["--calls", "8"])
    return remote_summary(out, run.phase, run.out, run.ready, time.monotonic() - created)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n")[0])
    parser.add_argument("--teardown", action="store_true", help="stop everything after the summary")
    parser.add_argument("--workdir", type=Path, help="keep logs and state here (default: temp)")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=15.0,
        help="the scaler's no-removal window for idle GPUs (default 15)",
    )
    parser.add_argument(
        "--nodes",
        choices=("auto", "real", "emulator"),
        default="auto",
        help="real kubelets with containerd and runc, kubelet emulators, or real where the "
        "machine allows it (default)",
    )
    parser.add_argument(
        "--chart",
        action="store_true",
        help="install the product with its Helm chart on three real nodes (root), every "
        "component and the fabric emulator a pod, instead of each component as a process",
    )
    return parser.parse_args(argv)


def start_control_plane(out: Progress, workdir: Path, chart: bool) -> tuple[ControlPlane, Kube]:
    with out.stage(
        "control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler v1.37"
    ):
        # The chart's pods need their service accounts' tokens, as in a cluster.
        cp = ControlPlane(find_binaries(), workdir=workdir / "cp", service_account_admission=chart)
        cp.start()
        kube = cp.kube()
        out.line(f"kubeconfig {cp.kubeconfig}")
    return cp, kube


def start_suite(out: Progress, suite: Suite, nodes: str, real: bool, why: str) -> None:
    kind = "real kubelets v1.37.1 + containerd + runc" if real else "kubelet emulators"
    with out.stage(
        f"the suite: fabric emulator, 3 nodes ({kind}) with a plugin each, operator, "
        "pool publisher, scaler"
    ):
        if real or nodes == "emulator":
            out.line(f"nodes: {kind} ({why})")
        else:
            out.line(f"nodes: falling back to kubelet emulators, no real node here: {why}")
        suite.start()
        out.line(f"fabric emulator at {suite.emulator.url}; Fabric {suite.fabric}")
        for line in pool_summary(suite):
            out.line(line)
        out.line("no node has a GPU of its own: every GPU below is attached from the pool")


def apply_examples(out: Progress, suite: Cluster, watcher: Watcher, real: bool) -> list[str]:
    """The examples applied, and their pods running; the pods' names."""
    with out.stage(f"applying deploy/examples: {', '.join(EXAMPLES)}"):
        pods = []
        for name in EXAMPLES:
            # On real nodes the pods run the local test image in the host network
            # (no registry, only the loopback CNI plugin); the scheduler still picks.
            adapt = (lambda pod: for_real_node(pod, None, IMAGE)) if real else None
            examples.apply(suite.kube, name, NAMESPACE, pod=adapt)
            pods += examples.pods(name)
            out.line(f"applied {name}.yaml ({', '.join(examples.pods(name))})")
        wait_for(
            lambda: all(suite.running(NAMESPACE, p) for p in pods),
            180,
            "every example pod to run",
            describe=suite.describe,
        )
        watcher.poll()
    watcher.poll()
    return pods


def examples_summary(suite: Cluster, watcher: Watcher, pods: list[str]) -> dict[str, Any]:
    times = [
        watcher.running_at[p] - watcher.created_at[p]
        for p in pods
        if p in watcher.running_at and p in watcher.created_at
    ]
    return {
        "pods_running": sum(suite.running(NAMESPACE, p) for p in pods),
        "time_to_gpu_s": round(statistics.median(times), 2) if times else None,
        "containers_ran": containers_ran(suite, pods),
    }


def release_idle(out: Progress, suite: Cluster, idle_seconds: float) -> None:
    with out.stage(
        f"releasing gpu-from-pool: its GPU stays on the node as an idle local "
        f"GPU, then goes back to the pool after {idle_seconds:.0f}s idle"
    ):
        before = {r["metadata"]["name"] for r in suite.resources()}
        suite.kube.delete(path("v1", "pods", "gpu-from-pool", namespace=NAMESPACE))
        wait_for(
            lambda: not before <= {r["metadata"]["name"] for r in suite.resources()},
            idle_seconds + 120,
            "an idle GPU to be detached",
            describe=suite.describe,
        )


def say_it_stays_up(cp: ControlPlane, workdir: Path) -> None:
    """Until Ctrl-C (or SIGTERM): the cluster stays up for a person to look at."""
    print(
        f"\nThe cluster stays up: kubectl --kubeconfig {cp.kubeconfig} get pods,"
        f"resourceclaims -n {NAMESPACE}; kubectl get composableresources,fabrics\n"
        f"Logs: {workdir}/suite/logs and {workdir}/cp/logs. Ctrl-C stops it.",
        flush=True,
    )


def wait_for_signal() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()


@dataclass(frozen=True)
class RemoteStep:
    """The demo's last step: what runs it (the stage's title), and the step."""

    title: str
    run: Callable[[Progress], dict[str, Any]]


PROCESS_REMOTE = (
    "the software fallback: a node no fabric reaches borrows another node's GPU over the "
    "network (donor and borrower: kubelet emulators; the scaler now also runs the lease "
    "controller)"
)
CHART_REMOTE = (
    "the software fallback: a node borrows another node's GPU over the network, all "
    "through the chart: the donor node's plugin-lend and donor DaemonSet pods lend it, the "
    "chart's scaler pod runs the lease controller, the borrower's pod runs matmul on it (no "
    "process started by the demo)"
)


@contextmanager
def cluster(
    args: argparse.Namespace,
    out: Progress,
    cp: ControlPlane,
    workdir: Path,
    real: tuple[Path | None, str],
) -> Iterator[tuple[Cluster, RemoteStep]]:
    """The cluster the demo runs on, started, and its remote step; stopped at the end."""
    node_bin_dir, why = real
    with contextlib.ExitStack() as stack:
        if args.chart:
            assert node_bin_dir is not None
            with out.stage(
                "the product installed by its Helm chart on 4 real nodes (kubelet v1.37.1 + "
                "containerd + runc): the plugin DaemonSet, the operator, pool publisher and "
                "scaler Deployments and the fabric emulator, all the chart's pods; lending on "
                "(the plugin-lend and donor DaemonSets on the donor node)"
            ):
                chart, lending = stack.enter_context(
                    demo_suite(
                        cp, cp.kube(), node_bin_dir, workdir / "nodes", args.idle_seconds, out.line
                    )
                )
                for line in pool_summary(chart):
                    out.line(line)
            yield chart, RemoteStep(CHART_REMOTE, lambda o: chart_remote_lease(lending, o))
            return
        suite = Suite(
            cp.kube(),
            cp.kubeconfig,
            workdir / "suite",
            SuiteOptions(
                no_removal=args.idle_seconds,
                real_hosts=SuiteOptions().hosts if node_bin_dir else (),
                node_bin_dir=node_bin_dir,
            ),
            suffix="demo",
            control_plane=cp,
        )
        stack.callback(suite.stop)
        start_suite(out, suite, args.nodes, node_bin_dir is not None, why)
        lab = Lab(cp.kube(), cp, workdir / "lending", namespace=REMOTE_NAMESPACE, prefix="lend-")
        stack.callback(lab.stop)

        def stop_scaler() -> None:
            if suite.scaler is not None:
                suite.scaler.stop()

        yield suite, RemoteStep(PROCESS_REMOTE, lambda o: remote_lease(stop_scaler, lab, o))


def demo_steps(
    args: argparse.Namespace,
    out: Progress,
    cp: ControlPlane,
    workdir: Path,
    suite: Cluster,
    remote: RemoteStep,
    summary: dict[str, Any],
) -> int:
    """The examples, the release, the remote lease; the summary printed; the exit code."""
    real = summary["kubelet"] != "emulator"
    watcher = Watcher(suite, out)
    try:
        workload_namespace(suite.kube, NAMESPACE)
        watcher.start()
        pods = apply_examples(out, suite, watcher, real)
        summary |= examples_summary(suite, watcher, pods)
        if real:
            with out.stage("what the containers printed (the GPUs their CDI spec injected)"):
                for p in pods:
                    out.line(f"{p}: {container_output(suite, p)}")
        release_idle(out, suite, args.idle_seconds)
        watcher.poll()
        summary["attaches"] = len(watcher.attached)
        summary["detaches"] = len(watcher.detached)
        watcher.stop()
        with out.stage(remote.title):
            summary["remote"] = remote.run(out)
        if not args.teardown:
            say_it_stays_up(cp, workdir)
        print(json.dumps(summary), flush=True)
        if not args.teardown:
            wait_for_signal()
        remote_ok = bool((summary.get("remote") or {}).get("ok"))
        return 0 if summary["pods_running"] == len(pods) and remote_ok else 1
    finally:
        watcher.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs.configure("demo", "warning")
    out = Progress()
    if args.chart and args.nodes == "emulator":
        raise SystemExit("--chart installs on real nodes: not with --nodes=emulator")
    real = real_node_binaries("real" if args.chart else args.nodes)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdra-demo-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "pods_running": 0,
        "time_to_gpu_s": None,
        "attaches": 0,
        "detaches": 0,
        "kubelet": "v1.37.1" if real[0] is not None else "emulator",
        "containers_ran": 0,
        # Each component as its own process, or the chart's pods (--chart).
        "installed_by": "helm" if args.chart else "process",
    }
    cp, _ = start_control_plane(out, workdir, args.chart)
    try:
        with cluster(args, out, cp, workdir, real) as (suite, remote):
            return demo_steps(args, out, cp, workdir, suite, remote, summary)
    finally:
        cp.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
