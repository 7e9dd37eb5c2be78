"""What the servers' limits did, for Prometheus (docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import Counter

LIMITED = Counter(
    "composable_dra_server_limited_total",
    "Connections a server refused or ended by its limits, and its failed accepts",
    ["server", "reason"],
)
