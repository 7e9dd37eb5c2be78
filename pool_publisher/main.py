"""``composable-dra pool-publisher``: publish the free GPUs of every Fabric as pools."""

from __future__ import annotations

import argparse
from typing import Any

from composable_dra.process.component import add_common_arguments, run_controller

SLICE_LIMIT = 128  # devices in one ResourceSlice (resource.k8s.io/v1)
# Free devices a pool offers at once (0: all): the scheduler's cost per pod grows with it
# (docs/attach-flow.md, Scale); each allocation's rewrite of the pool refills it. Off by
# default: docs/operations.md recommends 32 for large clusters.
FREE_PER_POOL = 0


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
        type=int,
        default=FREE_PER_POOL,
        help="publish at most this many free devices per pool, refilled as they are "
        "allocated (0: every free device); the scheduler's time per pod grows with it",
    )


def run(args: argparse.Namespace) -> int:
    from composable_dra.fabric.registry import Fabrics
    from pool_publisher.publish import PoolPublisher

    def make(kube: Any) -> PoolPublisher:
        return PoolPublisher(
            kube,
            Fabrics(kube),
            driver=args.driver_name,
            max_per_slice=min(SLICE_LIMIT, max(1, args.max_devices_per_slice)),
            max_free=max(0, args.max_free_devices_per_pool),
        )

    return run_controller(args, "pool-publisher", make)
