"""``remote_claims.py --scale-out``: a pipeline stage over 1 to 8 leased GPUs behind one
shaped link, at two link rates, against the knee its measured inputs predict.

Through DRA as a user runs it: a local control plane, two donors lending four GPUs each
(``--max-leases 4``), the scaler's lease controller and one consumer node, each its own
process (``testbed.lending.Lab``). The donors' data planes listen on the host's end of one
link (``testbed.shaped_link``: a network namespace behind a veth pair, ``tc tbf`` at the
rate in each direction); the pipeline pod's process runs inside that namespace, as a
pod's would in its own, so every frame to every donor crosses the one link.

Per link rate, in order: shape the link; measure its rate (iperf3, namespace to host,
as frames go); create a claim for eight remote GPUs and a pod running
``remote_gpu.workloads.scaleout`` with it, which measures the bytes a frame puts on the
link and one GPU's time per frame, then frames/s at every lease count 1..8 (frames in
order, each checked); from the inputs, predict the knee (``remote_gpu.knee``: the first
count whose demand the link cannot carry) and read the measured one from the sweep;
delete the pod and claim and wait for the eight leases to close.

GPU time is modelled: the donors run ``feature_extract``, which waits a fixed 66 ms per
frame (a Re-ID feature stage's device time; no GPU here, and waiting burns no CPU of the
two). The JSON says so (``gpu_time``). Frames of 64 KiB (a Re-ID crop) and links of
20 and 45 Mbit/s put the knee at about 3 and 6: inside 1..8 at both rates.

Goals: every pod ran; |predicted - measured| <= 1 at each rate (``knee_error_<rate>``).

Runs on the development machine (2 vCPUs, load average 7 to 18 from other work), twice:
iperf3 measured 2.39 MB/s at 20 Mbit/s and 5.35 to 5.38 MB/s at 45 Mbit/s, one GPU
0.067 to 0.069 s a frame; FPS by lease count 1..8 at 20 Mbit/s 14.5, 29.8, 36.3, 36.5,
36.5, 36.5, 35.8, 35.8 (knee 3 predicted and measured, both runs) and at 45 Mbit/s 15.0,
29.3, 42.8, 56.0, 73.0, 82.0, 82.3, 81.8 (knee 6 predicted and measured, both runs).
The whole run takes about 3 minutes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from composable_dra.k8s.kube import Kube, path
from hack.bench.goals import finish, goal
from remote_gpu.knee import LinkModel, measured_knee, predicted_knee
from testbed import ControlPlane
from testbed.lending import Lab
from testbed.remote_pods import remote_claim_and_pod
from testbed.shaped_link import ShapedLink
from testbed.wait import wait_for

RESOURCE = "resource.k8s.io/v1"
NAMESPACE = "bench-scaleout"
STAGE = "--allow=feature_extract=remote_gpu.builtins:feature_extract"
DONORS, GPUS = 2, 4
LEASES = DONORS * GPUS


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--scale-out")
    g.add_argument("--rates", default="20mbit,45mbit", help="link rates, tc's notation")
    g.add_argument("--frame-kib", type=int, default=64)
    g.add_argument("--count-seconds", type=float, default=4.0, help="measured time per count")


def phase(kube: Kube, name: str) -> str:
    pod = kube.get_or_none(path("v1", "pods", name, namespace=NAMESPACE)) or {}
    return str((pod.get("status") or {}).get("phase", ""))


def sweep(args: argparse.Namespace, lab: Lab, link: ShapedLink, rate: str) -> dict[str, Any]:
    """One link rate: its measured inputs, FPS per count, both knees."""
    kube, consumer = lab.kube, lab.consumers[0]
    link.shape(rate)
    link_rate = link.measure()
    name = f"scaleout-{rate}"
    workload = ["python", "-m", "remote_gpu.workloads.scaleout"]
    workload += ["--frame-kib", str(args.frame_kib), "--seconds", str(args.count_seconds)]
    claim, pod = remote_claim_and_pod(name, consumer.node, link.wrap(workload), count=LEASES)
    kube.create(path(RESOURCE, "resourceclaims", namespace=NAMESPACE), claim)
    kube.create(path("v1", "pods", namespace=NAMESPACE), pod)
    wait_for(
        lambda: phase(kube, name) in ("Succeeded", "Failed"),
        LEASES * (args.count_seconds + 3) + 180,
        f"the pipeline pod at {rate} to finish",
        interval=0.5,
        describe=lab.describe,
    )
    uid = kube.get(path("v1", "pods", name, namespace=NAMESPACE))["metadata"]["uid"]
    log = consumer.kubelet.container_log(uid, "main")
    line: dict[str, Any] = json.loads(log.strip().splitlines()[-1])
    out: dict[str, Any] = {"rate": rate, "link_bytes_per_s": round(link_rate)}
    out["ran"] = phase(kube, name) == "Succeeded" and bool(line.get("ok"))
    kube.delete(path("v1", "pods", name, namespace=NAMESPACE))
    kube.delete(path(RESOURCE, "resourceclaims", name, namespace=NAMESPACE))
    wait_for(lambda: lab.open_leases() == 0, 60, "the sweep's leases to close", interval=0.5)
    if not out["ran"]:
        return out | {"pod": line}
    return out | knees(line, link_rate)


def knees(line: dict[str, Any], link_rate: float) -> dict[str, Any]:
    """The model's inputs (each direction shaped alike: the larger of frame and result
    bounds it), its knee and the sweep's."""
    fps = {int(n): float(v) for n, v in line["fps_by_leases"].items()}
    model = LinkModel(max(line["frame_bytes"], line["result_bytes"]), line["compute_s"], link_rate)
    predicted, measured = predicted_knee(model, LEASES), measured_knee(fps)
    both = predicted is not None and measured is not None
    return {
        "frame_bytes": model.frame_bytes,
        "compute_s": model.compute_s,
        "per_gpu_fps_predicted": round(model.per_gpu_fps, 2),
        "link_fps_predicted": round(model.link_fps, 2),
        "fps_by_leases": line["fps_by_leases"],
        "knee_predicted": predicted,
        "knee_measured": measured,
        "knee_error": abs((predicted or 0) - (measured or 0)) if both else None,
    }


def run(args: argparse.Namespace, kube: Kube, cp: ControlPlane, workdir: Path) -> int:
    why = ShapedLink.available()
    if why is not None:
        raise SystemExit(f"--scale-out: {why}")
    link = ShapedLink(workdir).start()
    lab = Lab(kube, cp, workdir, namespace=NAMESPACE, domain="bench-scaleout")
    lab.donor_args, lab.data_host = [STAGE], link.host_address
    out: dict[str, Any] = {"leases": LEASES, "gpu_time": "modelled: 66 ms wait per frame"}
    try:
        lab.start(DONORS, GPUS, GPUS, 1)
        out["by_rate"] = {r: sweep(args, lab, link, r) for r in args.rates.split(",")}
    finally:
        lab.stop()
        link.stop()
    out["workdir"] = str(workdir)
    return finish(out, goals(out["by_rate"]))


def goals(by_rate: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every rate's pod ran, and its knees are at most one count apart."""
    ran = sum(bool(r["ran"]) for r in by_rate.values())
    out = {"ran": goal(ran, floor=len(by_rate))}
    for rate, r in by_rate.items():
        out[f"knee_error_{rate}"] = goal(r.get("knee_error"), ceiling=1)
    return out
