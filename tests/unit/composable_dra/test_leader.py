"""composable_dra.k8s.leader: the elector's requests name the component; the leader gauge."""

from __future__ import annotations

import argparse
import threading
from typing import Any

import pytest
from kubernetes import client
from kubernetes.leaderelection import leaderelection
from prometheus_client import REGISTRY

from composable_dra.k8s import leader
from testbed.wait import wait_for


def test_the_lease_lock_renews_through_the_components_client() -> None:
    api = client.ApiClient(client.Configuration())
    api.user_agent = "composable-dra/scaler"
    lock = leader.lease_lock("scaler", "composable-dra", "me", api)
    assert lock.api_instance.api_client is api
    assert lock.api_instance.api_client.user_agent == "composable-dra/scaler"


def _leading(lease: str) -> float | None:
    return REGISTRY.get_sample_value("composable_dra_leader", {"lease": lease})


class _Election:
    """The elector, at once leading until the lease is lost, then stopping."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def run(self) -> None:
        self.config.onstarted_leading()
        self.config.onstopped_leading()


def test_the_leader_gauge_is_1_while_leading_and_0_after_the_lease_is_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(leaderelection, "LeaderElection", _Election)
    lost = threading.Event()
    api = client.ApiClient(client.Configuration())
    leader.acquire("gauge-test", "composable-dra", lost, identity="me", api=api)
    assert _leading("gauge-test") == 1
    lost.set()
    wait_for(lambda: _leading("gauge-test") == 0, 5, "the gauge to drop to 0")


def test_a_process_without_election_leads_at_once_and_says_so() -> None:
    args = argparse.Namespace(leader_elect=False, leader_elect_lease="unelected")
    leader.lead(args, threading.Event(), None)
    assert _leading("unelected") == 1
    leader.mark("unelected", False)
    assert _leading("unelected") == 0


def test_an_elected_process_takes_its_lease_timings_from_its_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    elections: list[_Election] = []

    def election(config: Any) -> _Election:
        elections.append(_Election(config))
        return elections[-1]

    monkeypatch.setattr(leaderelection, "LeaderElection", election)
    args = argparse.Namespace(
        leader_elect=True,
        leader_elect_lease="timed",
        leader_elect_namespace="composable-dra",
        leader_elect_lease_duration=30,
        leader_elect_renew_deadline=20,
        leader_elect_retry_period=4,
    )
    lost = threading.Event()
    leader.lead(args, lost, client.ApiClient(client.Configuration()))
    config = elections[0].config
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (30, 20, 4)
    assert _leading("timed") == 1
    lost.set()
    wait_for(lambda: _leading("timed") == 0, 5, "the gauge to drop to 0")


class _Leases:
    """The coordination API as the lock calls it: one Lease, its holder and version."""

    def __init__(self, holder: str | None) -> None:
        self.lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name="scaler", resource_version="7"),
            spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=15),
        )
        self.replaced: list[client.V1Lease] = []

    def read_namespaced_lease(self, name: str, namespace: str) -> client.V1Lease:
        return self.lease

    def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease) -> None:
        self.replaced.append(body)


class _Lock:
    """The official LeaseLock's surface, counting the renewals that reach it."""

    def __init__(self, api: _Leases) -> None:
        self.name, self.namespace, self.identity = "scaler", "composable-dra", "pod-a_1"
        self.api_instance = api
        self.updates = 0

    def get(self, name: str, namespace: str) -> tuple[bool, None]:
        return True, None

    def create(self, name: str, namespace: str, election_record: object) -> bool:
        self.updates += 1
        return True

    def update(self, name: str, namespace: str, updated_record: object) -> bool:
        self.updates += 1
        return True


def test_a_released_lease_names_no_holder_and_is_never_renewed_again() -> None:
    api = _Leases("pod-a_1")
    lock = _Lock(api)
    held = leader.Releasable(lock)
    assert held.update("scaler", "composable-dra", object())
    assert held.release()
    (replaced,) = api.replaced
    assert replaced.spec.holder_identity is None
    assert replaced.metadata.resource_version == "7"  # a renewal in flight wins
    # The elector's thread, which cannot be stopped, may try again: refused here.
    assert not held.update("scaler", "composable-dra", object())
    assert not held.create("scaler", "composable-dra", object())
    assert lock.updates == 1


def test_a_lease_another_process_holds_is_left_alone_at_release() -> None:
    api = _Leases("pod-b_2")
    assert not leader.Releasable(_Lock(api)).release()
    assert api.replaced == []
    assert not leader.holds(None, "pod-a_1") and not leader.holds("", "")
    assert leader.holds("pod-a_1", "pod-a_1")


def test_a_process_without_election_has_no_lease_to_release() -> None:
    args = argparse.Namespace(leader_elect=False, leader_elect_lease="unelected-2")
    held = leader.lead(args, threading.Event(), None)
    assert held is None
    leader.release(held)  # nothing to give up
