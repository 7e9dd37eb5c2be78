"""`composable-dra operator`: attaches and detaches fabric devices for ComposableResources."""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
from typing import Any

from composable_dra.process.component import add_common_arguments, add_switch


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    add_common_arguments(p, lease="composable-operator", metrics_port=8080)
    p.add_argument(
        "--online-poll-seconds",
        type=float,
        default=10.0,
        help="how often an Online resource looks at its Fabric's latest inventory (read "
        "once per Fabric pollIntervalSeconds for all resources) and at its own status",
    )
    p.add_argument(
        "--unpublish-timeout",
        type=float,
        default=60.0,
        help="seconds a detach waits for the node's plugin to drop the detached device "
        "from its slice before it untaints it anyway (a Warning event, StillListed)",
    )
    add_switch(
        p,
        "--await-host-release",
        "AWAIT_HOST_RELEASE",
        help="before a detach, wait for the node's plugin to release the device on its "
        "host (HostReleased; docs/attach-flow.md). Default on; --no-await-host-release "
        "(env AWAIT_HOST_RELEASE=false) for plugins older than the release step, which "
        "never answer",
    )
    p.add_argument(
        "--host-release-timeout",
        type=float,
        default=120.0,
        help="seconds a detach waits for the host release before it says so (a Warning "
        "event, ReleaseOverdue; it waits on, forceDetach skips it) or, for a NotReady "
        "node, detaches without it",
    )
    p.add_argument(
        "--io-threads",
        type=int,
        default=int(env("IO_THREADS", "64")),
        help="threads for blocking fabric and API calls (concurrent attaches and detaches)",
    )


def run(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    import kopf
    from kubernetes import config

    from composable_dra.fabric.registry import Fabrics
    from composable_dra.k8s import leader
    from composable_dra.k8s.kube import Kube
    from composable_dra.process import logs, metrics
    from composable_operator import (
        composability_requests,
        controller,
        fabric_status,
        handlers,
        operator_setup,
    )
    from composable_operator.cluster_cache import ClusterCache

    log = logs.get(__name__)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's login_with_kubeconfig reads it
        config.load_kube_config(config_file=args.kubeconfig)
    else:
        config.load_incluster_config()
    metrics.serve(args.metrics_port)
    lost = threading.Event()
    kube = Kube.from_config(
        args.kubeconfig, pool_size=args.io_threads, user_agent="composable-dra/operator"
    )
    held = leader.lead(args, lost, api=kube.api)
    # One connection per I/O thread: each makes at most one fabric call at a time.
    fabrics = Fabrics(kube, connections=args.io_threads)
    settings = controller.ControllerSettings(
        driver=args.driver_name,
        online_poll=args.online_poll_seconds,
        unpublish_limit=args.unpublish_timeout,
        release_limit=args.host_release_timeout if args.await_host_release else None,
    )
    # Claims, slices and Nodes, kept by watches (started once, here).
    cache = ClusterCache(kube, args.driver_name).start()
    ctl = controller.Controller(kube, fabrics, settings, cache=cache)
    registry = kopf.OperatorRegistry()
    operator_setup.register(registry, in_cluster=not args.kubeconfig)
    handlers.register(registry, ctl)
    fabric_status.register(
        registry, fabric_status.FabricWatch(kube, fabrics, cache.nodes, ctl.inventories)
    )
    composability_requests.register(
        registry, composability_requests.RequestReconciler(kube, fabrics, cache.nodes)
    )
    log.info("operator starting")

    async def operate() -> None:
        stop = _stop_flag(registry, lost)
        loop = asyncio.get_running_loop()
        cache.slice_changes.bind(loop)
        # Every resource's daemon makes blocking fabric and API calls through
        # asyncio.to_thread; the default pool (cores + 4 threads) would queue twenty
        # concurrent attaches behind a handful of slow calls.
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=args.io_threads, thread_name_prefix="operator-io")
        )
        await kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop)

    asyncio.run(operate())
    cache.stop()
    ctl.fabrics.close()
    if lost.is_set():
        log.error("lost leadership; exiting so that a fresh process can compete again")
        return 1
    leader.release(held)  # the work has stopped: a follower may start at once
    return 0


def _stop_flag(registry: Any, lost: threading.Event) -> asyncio.Event:
    """kopf's stop flag (made in the running loop), raised when leadership is lost and as
    kopf cleans up.

    kopf waits on a threading.Event in an executor thread that would outlive a SIGTERM;
    an asyncio.Event, set from a daemon thread, does not. On a signal kopf leaves its
    waiter on the flag pending and gives such a task 5 s before cancelling it: raised on
    cleanup, the flag lets the process exit at once."""
    import kopf

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(
        target=lambda: (lost.wait(), loop.call_soon_threadsafe(stop.set)), daemon=True
    ).start()

    @kopf.on.cleanup(registry=registry)
    async def release_stop_flag(**_: object) -> None:
        stop.set()

    return stop
