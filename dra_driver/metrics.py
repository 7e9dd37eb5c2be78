"""The plugin's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

PREPARE_SECONDS = Histogram(
    "composable_dra_plugin_prepare_seconds",
    "Time to prepare one claim (NodePrepareResources), by result",
    ["result"],
    buckets=_BUCKETS,
)
UNPREPARE_SECONDS = Histogram(
    "composable_dra_plugin_unprepare_seconds",
    "Time to unprepare one claim (NodeUnprepareResources), by result",
    ["result"],
    buckets=_BUCKETS,
)
DEVICES_PUBLISHED = Gauge(
    "composable_dra_plugin_devices_published",
    "Devices in the node's ResourceSlices",
)
PREPARED_CLAIMS = Gauge(
    "composable_dra_plugin_prepared_claims",
    "Claims prepared on this node (checkpointed)",
)
RECONCILE_ERRORS = Counter(
    "composable_dra_plugin_slice_reconcile_errors_total",
    "Failed attempts to publish the node's ResourceSlices",
)
LEASE_REFRESHES = Counter(
    "composable_dra_plugin_lease_refreshes_total",
    "Remote leases of prepared claims whose new credentials were written into their "
    "directory after the lease controller re-opened them, by result",
    ["result"],
)
for _result in ("ok", "error"):
    LEASE_REFRESHES.labels(_result)
