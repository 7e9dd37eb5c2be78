"""The local demo: a real control plane, fake nodes with kubelet emulators, and the suite.

Run with `make demo` (or `python -m hack.demo --help`). Each stage prints what it does;
the last line is a JSON summary. By default the cluster stays up until Ctrl-C, with its
kubeconfig printed; `--teardown` stops it right after the summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from composable_dra import logs
from composable_dra.kube import Kube, path
from hack.localcluster import ControlPlane
from hack.localcluster.controlplane import find_binaries
from hack.localcluster.kubelet_emulator import KubeletEmulator
from hack.localcluster.minimal_plugin import MinimalPlugin
from hack.localcluster.nodes import create_node
from hack.localcluster.wait import wait_for

RESOURCE = "resource.k8s.io/v1"


class Stages:
    """Readable progress: one line per stage, with how long it took."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    @contextmanager
    def stage(self, title: str) -> Iterator[None]:
        start = time.monotonic()
        print(f"==> {title} ...", flush=True)
        yield
        print(f"    done in {time.monotonic() - start:.1f}s", flush=True)

    def note(self, text: str) -> None:
        print(f"    {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2, help="fake nodes (default 2)")
    parser.add_argument("--teardown", action="store_true", help="stop after the summary")
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir)")
    args = parser.parse_args(argv)
    logs.configure("demo", "warning")
    out = Stages()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="cdra-demo-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"pods_running": 0}
    with ExitStack() as stack:
        with out.stage(
            "starting the control plane (etcd, apiserver, controller-manager, scheduler)"
        ):
            cp = stack.enter_context(ControlPlane(find_binaries(), workdir=workdir / "cp"))
            kube = Kube.from_config(str(cp.kubeconfig))
            out.note(f"kubeconfig: {cp.kubeconfig}")
        nodes = [f"node-{i}" for i in range(args.nodes)]
        kubelets: dict[str, KubeletEmulator] = {}
        with out.stage(f"creating {len(nodes)} fake nodes with kubelet emulators"):
            for name in nodes:
                create_node(kube.api, name)
                root = workdir / "nodes" / name
                kubelets[name] = stack.enter_context(
                    KubeletEmulator(kube, name, root / "kubelet", root / "cdi")
                )
        driver = "gpu.composable.dra.io"
        with out.stage("starting a DRA plugin per node and publishing their devices"):
            for name, kubelet in kubelets.items():
                plugin = MinimalPlugin(
                    kube, driver, kubelet.plugins_registry_dir, kubelet.plugins_dir, kubelet.cdi_dir
                )
                plugin.start()
                stack.callback(plugin.stop)

                def registered(k: KubeletEmulator = kubelet) -> bool:
                    return driver in k.registered_drivers()

                wait_for(registered, 30, f"registration on {name}")
                kube.create(
                    path(RESOURCE, "resourceslices"),
                    {
                        "metadata": {"name": f"{name}-gpus"},
                        "spec": {
                            "driver": driver,
                            "nodeName": name,
                            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                            "devices": [{"name": "gpu-0"}],
                        },
                    },
                )
            kube.create(
                path(RESOURCE, "deviceclasses"),
                {
                    "metadata": {"name": "composable-gpu"},
                    "spec": {
                        "selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]
                    },
                },
            )
        with out.stage("running a pod that claims a GPU"):
            ns = "demo"
            kube.create(path("v1", "namespaces"), {"metadata": {"name": ns}})
            kube.create(
                path(RESOURCE, "resourceclaimtemplates", namespace=ns),
                {
                    "metadata": {"name": "one-gpu"},
                    "spec": {
                        "spec": {
                            "devices": {
                                "requests": [
                                    {
                                        "name": "gpu",
                                        "exactly": {"deviceClassName": "composable-gpu"},
                                    }
                                ]
                            }
                        }
                    },
                },
            )
            created = time.monotonic()
            kube.create(
                path("v1", "pods", namespace=ns),
                {
                    "metadata": {"name": "gpu-pod"},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "example.invalid/cuda",
                                "resources": {"claims": [{"name": "gpu"}]},
                            }
                        ],
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                    },
                },
            )
            pod_path = path("v1", "pods", "gpu-pod", namespace=ns)
            pod = wait_for(
                lambda: (p := kube.get(pod_path)).get("status", {}).get("phase") == "Running" and p,
                60,
                "the pod to run",
            )
            summary["time_to_gpu_s"] = round(time.monotonic() - created, 2)
            summary["pods_running"] = 1
            out.note(f"pod {ns}/gpu-pod runs on {pod['spec']['nodeName']}")
        print(json.dumps(summary), flush=True)
        if not args.teardown:
            print(
                f"\nThe cluster stays up. kubectl --kubeconfig {cp.kubeconfig} get pods -A\n"
                "Press Ctrl-C to stop it.",
                flush=True,
            )
            stop = threading.Event()
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            stop.wait()
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
