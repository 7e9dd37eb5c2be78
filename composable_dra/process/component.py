"""What the leader-elected controllers share in ``main``.

Flags for the API server, leader election and metrics (the pool publisher, the scaler
and the operator). For the pool publisher and the scaler (kopf runs the operator), a run
loop that waits for the lease, starts the controller, and stops on SIGTERM or when the
lease is lost (exit 1, so the Deployment restarts a follower that may lead again).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, Protocol

from composable_dra.k8s import leader
from composable_dra.model import names
from composable_dra.process import logs, metrics


class Controller(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


def env_switch(name: str, default: bool = True) -> bool:
    """A switch flag's default from the environment variable ``name``: off for 0, false
    or no (any case), else on; unset, ``default``."""
    value = os.environ.get(name)
    return default if value is None else value.lower() not in {"0", "false", "no"}


def add_switch(p: argparse.ArgumentParser, flag: str, env: str, help: str) -> None:
    """A ``--flag``/``--no-flag`` switch, on unless the chart's environment variable
    ``env`` turns it off (``env_switch``)."""
    p.add_argument(flag, action=argparse.BooleanOptionalAction, default=env_switch(env), help=help)


def add_common_arguments(p: argparse.ArgumentParser, lease: str, metrics_port: int = 0) -> None:
    """The flags of a leader-elected cluster controller: API access, the driver's name,
    leader election, metrics (on ``metrics_port`` unless METRICS_PORT names one)."""
    p.add_argument(
        "--kubeconfig", default=os.environ.get("KUBECONFIG"), help="in-cluster when unset"
    )
    p.add_argument("--driver-name", default=os.environ.get("DRIVER_NAME", names.DRIVER))
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="take a Lease before doing anything (default: on)",
    )
    p.add_argument("--leader-elect-lease", default=lease, help="the Lease's name")
    p.add_argument(
        "--leader-elect-namespace", default=os.environ.get("POD_NAMESPACE", "composable-dra")
    )
    p.add_argument("--leader-elect-lease-duration", type=int, default=15, help="seconds")
    p.add_argument("--leader-elect-renew-deadline", type=int, default=10, help="seconds")
    p.add_argument("--leader-elect-retry-period", type=int, default=2, help="seconds")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ.get("METRICS_PORT") or metrics_port),
        help="0: off",
    )


def run_controller(
    args: argparse.Namespace, component: str, make: Callable[[Any], Controller]
) -> int:
    """Lead (when asked to), then run ``make(kube)`` until a signal or a lost lease."""
    from kubernetes import config

    from composable_dra.k8s.kube import Kube

    log = logs.get(component)
    # Libraries that log every request or renewal at info: keep their warnings only.
    for noisy in ("redfish", "leaderelection"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    stop = threading.Event()
    lost = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()
        lost.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    if args.kubeconfig:
        config.load_kube_config(config_file=args.kubeconfig)
    else:
        config.load_incluster_config()
    kube = Kube.from_config(args.kubeconfig, user_agent=f"composable-dra/{component}")
    metrics.serve(args.metrics_port)
    held = leader.lead(args, lost, api=kube.api)
    if stop.is_set():
        return 0
    controller = make(kube)
    controller.start()
    log.info("started", component=component, leader_elect=args.leader_elect)
    while not stop.is_set():
        if lost.wait(0.5) and not stop.is_set():
            log.error("lost the lease; exiting so that a new leader takes over")
            controller.stop()
            return 1
    controller.stop()
    leader.release(held)  # the work has stopped: a follower may start at once
    return 0
