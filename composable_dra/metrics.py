"""The Prometheus endpoint every component serves."""

from __future__ import annotations

from prometheus_client import start_http_server


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics from the default registry; port 0 turns the endpoint off."""
    if port:
        start_http_server(port, addr=addr)
