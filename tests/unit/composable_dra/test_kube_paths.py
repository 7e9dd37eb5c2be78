"""API paths built from names that may come from outside stay the path they mean."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.k8s.kube import path, segment


def test_ordinary_paths() -> None:
    assert path("v1", "nodes") == "/api/v1/nodes"
    assert (
        path("resource.k8s.io/v1", "resourceclaims", "c1", namespace="default")
        == "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/c1"
    )
    assert path("v1", "pods", "p", namespace="ns", subresource="status") == (
        "/api/v1/namespaces/ns/pods/p/status"
    )
    # RBAC names carry colons; they stay one segment.
    assert path("rbac.authorization.k8s.io/v1", "clusterroles", "system:a") == (
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aa"
    )


@pytest.mark.parametrize(
    ("name", "namespace"),
    [("../../nodes/n1", "default"), ("c1", "kube-system/secrets"), ("a?b#c", "x y")],
)
def test_a_name_cannot_change_the_path(name: str, namespace: str) -> None:
    url = path("resource.k8s.io/v1", "resourceclaims", name, namespace=namespace)
    prefix = "/apis/resource.k8s.io/v1/namespaces/"
    assert url.startswith(prefix)
    ns_seg, plural, name_seg = url[len(prefix) :].split("/")
    assert plural == "resourceclaims"
    assert "?" not in url and "#" not in url and " " not in url
    assert (ns_seg, name_seg) == (segment(namespace), segment(name))


@pytest.mark.parametrize("bad", [".", ".."])
def test_dot_segments_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="cannot be an object name"):
        path("v1", "secrets", bad, namespace="default")
    with pytest.raises(ValueError, match="cannot be an object name"):
        path("v1", "secrets", "s", namespace=bad)


@settings(max_examples=200)
@given(name=st.text(min_size=1, max_size=30), namespace=st.text(min_size=1, max_size=30))
def test_fuzz_every_name_is_one_segment(name: str, namespace: str) -> None:
    try:
        url = path("v1", "pods", name, namespace=namespace, subresource="status")
    except ValueError:
        assert {name, namespace} & {".", ".."}
        return
    parts = url.split("/")
    assert parts[:4] == ["", "api", "v1", "namespaces"]
    assert len(parts) == 8 and parts[5] == "pods" and parts[7] == "status"
    assert parts[4] not in (".", "..") and parts[6] not in (".", "..")
