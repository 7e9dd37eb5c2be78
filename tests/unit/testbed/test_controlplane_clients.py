"""testbed.ControlPlane's clients: the one place the tests, the benchmarks and the demo
make their admin clients of the local API server, from its kubeconfig."""

from __future__ import annotations

from pathlib import Path

import yaml

from testbed.controlplane import ControlPlane

SERVER = "https://127.0.0.1:6443"


def _control_plane(tmp_path: Path) -> ControlPlane:
    cp = ControlPlane(bin_dir=tmp_path, workdir=tmp_path)
    cluster = {"server": SERVER, "insecure-skip-tls-verify": True}
    cp.kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": cluster}],
                "users": [{"name": "admin", "user": {"token": "t"}}],
                "contexts": [{"name": "admin", "context": {"cluster": "local", "user": "admin"}}],
                "current-context": "admin",
            }
        )
    )
    return cp


def test_clients_talk_to_the_control_planes_api_server(tmp_path: Path) -> None:
    cp = _control_plane(tmp_path)
    assert cp.api_client().configuration.host == SERVER
    kube = cp.kube(pool_size=7, user_agent="bench/test")
    assert kube.api.configuration.host == SERVER
    assert kube.api.configuration.connection_pool_maxsize == 7
    assert kube.api.user_agent == "bench/test"
