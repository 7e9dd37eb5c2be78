"""``composable-dra pool-publisher``: publish the free GPUs of every Fabric as pools."""

from __future__ import annotations

import argparse
from typing import Any

from composable_dra.process.component import add_common_arguments, add_switch, run_controller
from pool_publisher.window import AUTO

SLICE_LIMIT = 128  # devices in one ResourceSlice (resource.k8s.io/v1)


def window_arg(value: str) -> int:
    """``auto`` (the window sizes itself to the pending claims), 0 (every free device) or
    a fixed number of free devices per pool."""
    if value == "auto":
        return AUTO
    n = int(value)
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: auto, 0 or a positive number")
    return n


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, lease="composable-dra-pool-publisher")
    p.add_argument(
        "--max-devices-per-slice",
        type=int,
        default=SLICE_LIMIT,
        help=f"split a pool into slices of at most this many devices (API limit {SLICE_LIMIT})",
    )
    p.add_argument(
        "--max-free-devices-per-pool",
        type=window_arg,
        default=AUTO,
        help="free devices a pool offers at once, refilled as they are allocated: auto "
        "(default: the pending claims' share of each pool plus a margin, at least 8, within "
        "a cap that shrinks as the cluster grows: 4 at 1,000 nodes), 0 (every free device) "
        "or a fixed number; the scheduler's time per pod grows with it",
    )
    add_switch(
        p,
        "--label-nodes",
        "LABEL_NODES",
        help="label each zone's Nodes <fabric>.zone.composable.dra.io/<zone>=true (needs "
        "patch on nodes), so that a pool selects its zone by that one label, not a list of "
        "hostnames that kube-scheduler parses for every node. Default on; "
        "--no-label-nodes (env LABEL_NODES=false): hostnames, or the Fabric's zoneNodeLabels",
    )


def run(args: argparse.Namespace) -> int:
    from composable_dra.fabric.registry import Fabrics
    from composable_dra.k8s.feature_probe import Probes, check_at_start
    from composable_dra.process import logs
    from pool_publisher.publish import PoolPublisher
    from pool_publisher.served import Served

    def make(kube: Any) -> PoolPublisher:
        # Its pools carry binding conditions and health taints: say whether they survive.
        probes = Probes(args.driver_name, slices=True)
        found = check_at_start(kube, probes, [], logs.get("pool-publisher"), "pool-publisher")
        return PoolPublisher(
            kube,
            Fabrics(kube),
            driver=args.driver_name,
            max_per_slice=min(SLICE_LIMIT, max(1, args.max_devices_per_slice)),
            max_free=args.max_free_devices_per_pool,
            served=Served.of(found),
            label_nodes=args.label_nodes,
        )

    return run_controller(args, "pool-publisher", make)
