"""Events about a ResourceClaim, as the scaler, its lease controller and the pool publisher
post them (composable_dra/k8s/events.py)."""

from __future__ import annotations

from composable_dra.k8s.events import claim_object, event_body


def test_an_event_about_a_claim_names_it_by_kind_version_namespace_and_uid() -> None:
    involved = claim_object("train", "team-a", "u-1")
    assert involved == {
        "kind": "ResourceClaim",
        "apiVersion": "resource.k8s.io/v1",
        "name": "train",
        "namespace": "team-a",
        "uid": "u-1",
    }
    body = event_body(involved, "team-a", "Warning", "Why", "words", "composable-dra-scaler")
    assert body["involvedObject"] == involved
    assert body["metadata"]["namespace"] == "team-a"
    assert body["metadata"]["name"].startswith("train.")
