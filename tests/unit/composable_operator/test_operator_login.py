"""The operator logs in with kopf's own login functions, read afresh at every login: a
rotated token is used the next time kopf logs in (kopf does when a token is refused)."""

from __future__ import annotations

import os
from pathlib import Path

import kopf
import pytest
import yaml

from composable_operator.operator_setup import login


def kubeconfig(path: Path, token: str) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": "https://api.example:6443"}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )


def test_a_rotated_token_is_read_at_the_next_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "kubeconfig"
    kubeconfig(config, "first")
    monkeypatch.setenv("KUBECONFIG", str(config))
    settings = kopf.OperatorSettings()
    info = login(False, settings=settings)
    assert info is not None and (info.server, info.token) == ("https://api.example:6443", "first")
    kubeconfig(config, "rotated")
    info = login(False, settings=settings)
    assert info is not None and info.token == "rotated"


def test_kopf_keeps_no_diff_base_and_no_handler_needs_one() -> None:
    # kopf wrote its diff base (an annotation) once per resource created and again on
    # every spec or annotation change: writes no handler of ours reads. Only handlers
    # that compare old and new (on.create, on.update, on.field, on.resume) need it.
    from composable_operator import composability_requests, fabric_status, handlers
    from composable_operator.operator_setup import NoDiffBase, register

    registry = kopf.OperatorRegistry()
    register(registry, in_cluster=True)
    handlers.register(registry, None)  # type: ignore[arg-type]
    fabric_status.register(registry, None)  # type: ignore[arg-type]
    composability_requests.register(registry, None)  # type: ignore[arg-type]
    reasons = {h.reason for h in registry._changing.get_all_handlers()}
    assert reasons == {kopf.Reason.DELETE}
    settings = kopf.OperatorSettings()
    [configure] = [h for h in registry._activities.get_all_handlers() if h.id.endswith("configure")]
    configure.fn(settings=settings)  # type: ignore[call-arg]
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, NoDiffBase)
    body = kopf.Body({"metadata": {"name": "r"}, "spec": {"deviceID": "gpu-1"}})
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=storage.build(body=body))
    assert not patch and storage.fetch(body=body) is None


def service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod's service account files, where kopf reads them."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("tok")
    real_exists = os.path.exists
    monkeypatch.setattr(
        "kopf._core.intents.piggybacking.os.path.exists",
        lambda p: real_exists(str(p).replace(SA_DIR, str(sa))),
    )
    real_open = open
    monkeypatch.setattr(
        "builtins.open",
        lambda p, *a, **k: real_open(str(p).replace(SA_DIR, str(sa)), *a, **k),
    )


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("10.0.0.1", "443", "https://10.0.0.1:443"),
        ("fd00::1", "6443", "https://[fd00::1]:6443"),
    ],
)
def test_in_cluster_it_reaches_the_api_server_where_the_kubelet_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str, port: str, server: str
) -> None:
    # As client-go and the kubernetes client do: KUBERNETES_SERVICE_HOST and _PORT, not
    # the DNS name kopf's own login names (a node without cluster DNS cannot resolve it).
    service_account(tmp_path, monkeypatch)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    info = login(True, settings=kopf.OperatorSettings())
    assert info is not None and (info.server, info.token) == (server, "tok")


def test_in_cluster_without_the_service_env_it_keeps_kopfs_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    service_account(tmp_path, monkeypatch)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    info = login(True, settings=kopf.OperatorSettings())
    assert info is not None and info.server == "https://kubernetes.default.svc"
