"""Leader election on a coordination.k8s.io Lease, with the official client's elector."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import uuid

from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock
from prometheus_client import Gauge

from composable_dra.process import logs

log = logs.get(__name__)
# The elector logs every renewal at info; keep its warnings, report transitions ourselves.
logging.getLogger("leaderelection").setLevel(logging.WARNING)

# 1 while this process does its lease's work (also when it runs without election), 0 while
# it waits for the lease or after losing it: no process at 1 for a lease is a leader lost.
LEADING = Gauge(
    "composable_dra_leader",
    "1 while this process leads its lease (or runs without election), else 0",
    ["lease"],
)


def mark(lease: str, leading: bool) -> None:
    LEADING.labels(lease).set(1 if leading else 0)


def lead(args: argparse.Namespace, lost: threading.Event, api: client.ApiClient | None) -> None:
    """Block until this process leads ``args.leader_elect_lease`` (in
    ``args.leader_elect_namespace``, with the timings of its ``--leader-elect-*`` flags,
    ``process.component.add_common_arguments``) when ``args.leader_elect``; without
    election it leads at once. Either way the leader gauge says so."""
    if args.leader_elect:
        acquire(
            args.leader_elect_lease,
            args.leader_elect_namespace,
            lost,
            lease_duration=args.leader_elect_lease_duration,
            renew_deadline=args.leader_elect_renew_deadline,
            retry_period=args.leader_elect_retry_period,
            api=api,
        )
    mark(args.leader_elect_lease, not lost.is_set())


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def lease_lock(
    lease: str, namespace: str, identity: str, api: client.ApiClient | None
) -> LeaseLock:
    """The elector's lock, reading and renewing through ``api`` (whose user agent names
    the component); LeaseLock alone uses the default client, whose agent is the
    generator's."""
    lock = LeaseLock(lease, namespace, identity)
    if api is not None:
        lock.api_instance = client.CoordinationV1Api(api)
    return lock


def acquire(
    lease: str,
    namespace: str,
    lost: threading.Event,
    identity: str | None = None,
    lease_duration: int = 15,
    renew_deadline: int = 10,
    retry_period: int = 2,
    api: client.ApiClient | None = None,
) -> None:
    """Block until this process leads; set ``lost`` if it stops leading later.

    The kubernetes client must be configured globally (config.load_*) before calling;
    ``api``: the component's client (``Kube.api``), so that its renewals name it.
    A process that lost its lease must stop its work: the caller watches ``lost``.
    """
    leading = threading.Event()
    me = identity or default_identity()
    mark(lease, False)

    def started() -> None:
        log.info("became leader", lease=f"{namespace}/{lease}", identity=me)
        mark(lease, True)
        leading.set()
        lost.wait()

    def stopped() -> None:
        log.warning("stopped leading", lease=f"{namespace}/{lease}", identity=me)
        mark(lease, False)
        lost.set()

    config = electionconfig.Config(
        lease_lock(lease, namespace, me, api),
        lease_duration=lease_duration,
        renew_deadline=renew_deadline,
        retry_period=retry_period,
        onstarted_leading=started,
        onstopped_leading=stopped,
    )
    thread = threading.Thread(
        target=leaderelection.LeaderElection(config).run, name="leader-election", daemon=True
    )
    thread.start()
    log.info("waiting for leadership", lease=f"{namespace}/{lease}", identity=me)
    while not leading.wait(1.0):
        if lost.is_set():
            return
