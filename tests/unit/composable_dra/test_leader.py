"""composable_dra.k8s.leader: the elector's requests name the component."""

from __future__ import annotations

from kubernetes import client

from composable_dra.k8s import leader


def test_the_lease_lock_renews_through_the_components_client() -> None:
    api = client.ApiClient(client.Configuration())
    api.user_agent = "composable-dra/scaler"
    lock = leader.lease_lock("scaler", "composable-dra", "me", api)
    assert lock.api_instance.api_client is api
    assert lock.api_instance.api_client.user_agent == "composable-dra/scaler"
