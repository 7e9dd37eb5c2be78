"""Leader election on a coordination.k8s.io Lease, with the official client's elector."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any

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


def lead(
    args: argparse.Namespace, lost: threading.Event, api: client.ApiClient | None
) -> Releasable | None:
    """Block until this process leads ``args.leader_elect_lease`` (in
    ``args.leader_elect_namespace``, with the timings of its ``--leader-elect-*`` flags,
    ``process.component.add_common_arguments``) when ``args.leader_elect``; without
    election it leads at once. Either way the leader gauge says so. Returns the lock to
    ``release`` at a clean stop (None without election)."""
    held = None
    if args.leader_elect:
        timings = Timings.from_args(args)
        held = acquire(args.leader_elect_lease, args.leader_elect_namespace, lost, timings, api=api)
    mark(args.leader_elect_lease, not lost.is_set())
    return held


@dataclass(frozen=True)
class Timings:
    """The elector's seconds (client-go's LeaseDuration, RenewDeadline, RetryPeriod)."""

    lease_duration: int = 15
    renew_deadline: int = 10
    retry_period: int = 2

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Timings:
        """From the ``--leader-elect-*`` flags (``process.component.add_common_arguments``)."""
        return cls(
            args.leader_elect_lease_duration,
            args.leader_elect_renew_deadline,
            args.leader_elect_retry_period,
        )


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


def holds(holder: str | None, identity: str) -> bool:
    """Whether a Lease whose holderIdentity is ``holder`` is held by ``identity``."""
    return bool(holder) and holder == identity


class Releasable:
    """The elector's lock, which this process can give up at a clean stop.

    The official elector has no release (client-go's ReleaseOnCancel) and cannot be
    stopped: once released, this lock refuses its renewals, and the Lease's holder is
    cleared, so that a follower takes it at its next try rather than after the lease
    duration, and an uninstalled release leaves no holder naming a pod that is gone.
    """

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self.name: str = lock.name
        self.namespace: str = lock.namespace
        self.identity: str = lock.identity
        self.released = threading.Event()

    def get(self, name: str, namespace: str) -> Any:
        return self.lock.get(name, namespace)

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        return not self.released.is_set() and bool(
            self.lock.create(name, namespace, election_record)
        )

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        return not self.released.is_set() and bool(
            self.lock.update(name, namespace, updated_record)
        )

    def release(self) -> bool:
        """Stop renewing; clear the Lease's holder if it is still this process. A failure
        is logged, not raised: the lease then expires after its duration."""
        self.released.set()
        where = f"{self.namespace}/{self.name}"
        try:
            lease = self.lock.api_instance.read_namespaced_lease(self.name, self.namespace)
            if not holds(lease.spec.holder_identity, self.identity):
                return False
            lease.spec.holder_identity = None  # resourceVersion kept: a newer write wins
            self.lock.api_instance.replace_namespaced_lease(self.name, self.namespace, lease)
        except client.ApiException as exc:
            log.warning("could not release the lease", lease=where, status=exc.status)
            return False
        mark(self.name, False)
        log.info("released the lease", lease=where, identity=self.identity)
        return True


def release(held: Releasable | None) -> None:
    """At a clean stop, after the work stopped: give up what ``lead`` returned, if any."""
    if held is not None:
        held.release()


def acquire(
    lease: str,
    namespace: str,
    lost: threading.Event,
    timings: Timings = Timings(),
    identity: str | None = None,
    api: client.ApiClient | None = None,
) -> Releasable:
    """Block until this process leads; set ``lost`` if it stops leading later. Returns
    the lock, whose ``release`` gives the lease up at a clean stop.

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

    lock = Releasable(lease_lock(lease, namespace, me, api))
    config = electionconfig.Config(
        lock,
        lease_duration=timings.lease_duration,
        renew_deadline=timings.renew_deadline,
        retry_period=timings.retry_period,
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
            return lock
    return lock
