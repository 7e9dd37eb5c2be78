"""kopf settings shared by our controllers: where kopf keeps its own bookkeeping."""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes import client

from composable_dra import names


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = names.FINALIZER
        # Our CRDs' schemas have no status.kopf: keep kopf's state in annotations.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=names.PREFIX, key="last-handled-configuration"
        )
        settings.posting.level = logging.INFO
        settings.watching.server_timeout = 60
        settings.watching.client_timeout = 90
        settings.networking.request_timeout = 30
        settings.execution.max_workers = 16

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info()


def connection_info() -> kopf.ConnectionInfo:
    """kopf's credentials from the official client's configuration (kubeconfig or in-cluster).

    The caller loads that configuration first (config.load_kube_config/load_incluster_config).
    """
    cfg = client.Configuration.get_default_copy()
    token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
    scheme, _, token_value = (token or "").partition(" ")
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        scheme=scheme or None if token_value else None,
        token=token_value or None,
        default_namespace=None,
    )
