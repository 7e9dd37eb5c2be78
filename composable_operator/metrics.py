"""The operator's Prometheus metrics (names shared across the suite: composable_dra_*)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)

ATTACH_SECONDS = Histogram(
    "composable_dra_attach_seconds",
    "From a ComposableResource's creation to Online (fabric attach and node visibility).",
    ["fabric"],
    buckets=_LATENCY_BUCKETS,
)
DETACH_SECONDS = Histogram(
    "composable_dra_detach_seconds",
    "From the start of a detach to the device being back in the pool.",
    ["fabric"],
    buckets=_LATENCY_BUCKETS,
)
FABRIC_ERRORS = Counter(
    "composable_dra_fabric_errors_total",
    "Fabric calls that failed, by error type.",
    ["fabric", "type"],
)
FABRIC_CALLS = Counter(
    "composable_dra_fabric_operations_total",
    "Attach and detach calls made to the fabric.",
    ["fabric", "operation"],
)
# 1 after a pass read the fabric's inventory, 0 after a pass that could not.
FABRIC_REACHABLE = Gauge(
    "composable_dra_fabric_reachable",
    "Whether the last inventory read of a fabric succeeded (1) or failed (0).",
    ["fabric"],
)
RECONCILE_ERRORS = Counter(
    "composable_dra_reconcile_errors_total",
    "Reconcile passes that ended in an unexpected error.",
    ["controller"],
)
POOL_FREE = Gauge(
    "composable_dra_pool_free_devices",
    "Free devices in a fabric, by model.",
    ["fabric", "model"],
)
