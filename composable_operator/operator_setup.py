"""kopf settings shared by our controllers: where kopf keeps its own bookkeeping, and how
it logs in (kopf's own login functions, so that refreshed credentials are picked up)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from composable_dra.model import names


class NoDiffBase(kopf.DiffBaseStorage):
    """No diff base kept. kopf stores one (the last handled spec, labels and annotations)
    for handlers that compare old and new: on.create, on.update, on.field. Ours are
    daemons, an index and on.delete, which compare nothing, and storing it cost one
    write per resource created and one more per spec or annotation change (the scaler's
    release and idle stamps). Without it kopf sees each event as a creation that no
    handler wants: nothing is written."""

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def register(registry: kopf.OperatorRegistry, in_cluster: bool) -> None:
    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = names.FINALIZER
        # Our CRDs' schemas have no status.kopf: keep kopf's state in annotations.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.PREFIX)
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 60
        settings.watching.client_timeout = 90
        settings.networking.request_timeout = 30
        settings.execution.max_workers = 16

    @kopf.on.login(registry=registry)
    def on_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return login(in_cluster, **kwargs)


def login(in_cluster: bool, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own logins: kopf calls this again whenever the API server refuses the
    credentials, so a rotated service-account token (or kubeconfig) is read afresh."""
    if in_cluster:
        info = kopf.login_with_service_account(**kwargs)
        server = service_server(os.environ)
        if info is None or server is None:
            return info
        return dataclasses.replace(info, server=server)
    return kopf.login_with_kubeconfig(**kwargs)  # KUBECONFIG, as the caller set it


def service_server(env: Mapping[str, str]) -> str | None:
    """The API server's URL from the address the kubelet gives every pod, as client-go's
    and the kubernetes client's in-cluster configs take it. kopf's own login names
    ``kubernetes.default.svc``, which only cluster DNS resolves: the operator alone
    needed it, and a node without it left the operator retrying forever."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
