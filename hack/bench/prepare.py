"""NodePrepareResources latency through the plugin's socket, with real claims.

Starts a local control plane, one fake node and the plugin (static source) as its own
process, creates CLAIMS allocated one-device ResourceClaims in the API server, and calls
NodePrepareResources for each over the unix socket (each followed by an untimed
NodeUnprepareResources, so a device serves the next claim). The last line printed is
JSON: calls, p50_ms, p99_ms, errors.

Usage: KUBE_BIN_DIR=... python hack/bench/prepare.py [--claims 500] [--devices 8]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from api.dra.v1 import api_pb2 as v1  # noqa: E402
from api.dra.v1 import api_pb2_grpc as v1_grpc  # noqa: E402
from composable_dra.k8s.kube import Conflict, Kube, path  # noqa: E402
from composable_dra.model import names  # noqa: E402
from dra_driver.grpc_server import service_socket  # noqa: E402
from hack.bench.stats import percentile  # noqa: E402
from testbed import ControlPlane  # noqa: E402
from testbed.controlplane import find_binaries  # noqa: E402
from testbed.nodes import create_node  # noqa: E402
from testbed.plugin_process import PluginProcess, write_static_devices  # noqa: E402
from testbed.wait import wait_for  # noqa: E402

RESOURCE = "resource.k8s.io/v1"
DRIVER = names.DRIVER
NAMESPACE = "bench"


def make_claims(kube: Kube, node: str, count: int, devices: int) -> list[v1.Claim]:
    claims = []
    for i in range(count):
        name = f"claim-{i}"
        obj = kube.create(
            path(RESOURCE, "resourceclaims", namespace=NAMESPACE),
            {
                "metadata": {"name": name},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "composable-gpu"}}
                        ]
                    }
                },
            },
        )
        result = {"request": "gpu", "driver": DRIVER, "pool": node, "device": f"gpu-{i % devices}"}
        kube.merge_patch(
            path(RESOURCE, "resourceclaims", name, namespace=NAMESPACE, subresource="status"),
            {"status": {"allocation": {"devices": {"results": [result]}}}},
        )
        claims.append(v1.Claim(namespace=NAMESPACE, name=name, uid=obj["metadata"]["uid"]))
    return claims


def prepare_each(plugins_dir: Path, claims: list[v1.Claim]) -> tuple[list[float], int]:
    """Prepare and unprepare each claim in turn over the plugin's DRA socket: the
    latency of each prepare in ms, and how many calls failed."""
    channel = grpc.insecure_channel(f"unix://{service_socket(plugins_dir, DRIVER)}")
    stub = v1_grpc.DRAPluginStub(channel)
    # One warm-up call: connection set-up is not prepare latency.
    stub.NodePrepareResources(v1.NodePrepareResourcesRequest(), timeout=10)
    latencies: list[float] = []
    errors = 0
    for c in claims:
        start = time.perf_counter()
        resp = stub.NodePrepareResources(v1.NodePrepareResourcesRequest(claims=[c]), timeout=10)
        latencies.append((time.perf_counter() - start) * 1000)
        entry = resp.claims[c.uid]
        if entry.error or not entry.devices:
            errors += 1
            print(f"error for {c.name}: {entry.error}", file=sys.stderr)
        un = stub.NodeUnprepareResources(v1.NodeUnprepareResourcesRequest(claims=[c]), timeout=10)
        if un.claims[c.uid].error:
            errors += 1
    channel.close()
    return latencies, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=500)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--no-fsync", action="store_true", help="pass --no-fsync to the plugin")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cdra-bench-", dir="/tmp"))
    plugin: PluginProcess | None = None
    try:
        with ControlPlane(find_binaries(), workdir=work / "cp") as cp:
            kube = cp.kube()
            node = "bench-node"
            create_node(kube.api, node)
            kube.create(path("v1", "namespaces"), {"metadata": {"name": NAMESPACE}})
            with contextlib.suppress(Conflict):
                kube.create(
                    path(RESOURCE, "deviceclasses"),
                    {
                        "metadata": {"name": "composable-gpu"},
                        "spec": {
                            "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]
                        },
                    },
                )
            plugin = PluginProcess.standalone(
                node, cp.kubeconfig, work, ["--no-fsync"] if args.no_fsync else []
            )
            write_static_devices(
                plugin.static_file,
                [
                    {"uuid": f"GPU-bench-{i}", "name": f"gpu-{i}", "memory": "80Gi"}
                    for i in range(args.devices)
                ],
            )
            plugin.start()
            wait_for(
                lambda: plugin is not None and plugin.logged("slices in sync"),
                60,
                "the plugin to start",
                describe=plugin.log_tail,
            )
            claims = make_claims(kube, node, args.claims, args.devices)

            latencies, errors = prepare_each(work / "plugins", claims)
            code = plugin.stop()
            if code != 0:
                print(plugin.log_tail(), file=sys.stderr)
                errors += 1
    finally:
        if plugin is not None:
            plugin.kill()
        shutil.rmtree(work, ignore_errors=True)

    print(
        json.dumps(
            {
                "calls": len(latencies),
                "p50_ms": round(statistics.median(latencies), 3),
                "p99_ms": round(percentile(latencies, 0.99), 3),
                "mean_ms": round(statistics.fmean(latencies), 3),
                "errors": errors,
                "fsync": not args.no_fsync,
            }
        )
    )
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
