"""Prometheus metrics for both sides, labelled ``side`` (donor or client)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BYTES = Counter("remote_gpu_bytes_total", "Payload bytes moved", ["side", "direction", "transport"])
INVOCATIONS = Counter("remote_gpu_invocations_total", "Invocations completed", ["side"])
ERRORS = Counter("remote_gpu_errors_total", "Errors by type", ["side", "code"])
LATENCY = Histogram(
    "remote_gpu_invoke_seconds",
    "Invocation latency (client: round trip; donor: worker time)",
    ["side"],
    buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
)
# The client's side of a donor restart (remote_gpu.reconnect).
RECONNECTS = Counter(
    "remote_gpu_reconnects_total", "Client connections to a lease made again, by result", ["result"]
)
CALLS_LOST = Counter(
    "remote_gpu_calls_lost_total",
    "Client calls in flight when their connection was lost: retried (idempotent) or failed",
    ["outcome"],
)
for _label in ("ok", "failed"):
    RECONNECTS.labels(_label)
for _label in ("retried", "failed"):
    CALLS_LOST.labels(_label)
LEASES = Gauge("remote_gpu_leases_held", "Leases held by the donor")
LEASES_TOTAL = Counter("remote_gpu_leases_opened", "Leases opened", ["transport"])
ADMISSION_REFUSALS = Counter("remote_gpu_admission_refusals_total", "Leases refused by admission")
# Per-donor link use (one donor per process): what admission counts with, and how much
# of it the open leases declared; the bytes actually moved are remote_gpu_bytes_total.
LINK_CAPACITY = Gauge(
    "remote_gpu_link_capacity_bytes_per_second",
    "Usable link bandwidth for admission: measured or given x headroom (0: not limited)",
)
LINK_ADMITTED = Gauge(
    "remote_gpu_link_admitted_bytes_per_second",
    "Bytes/s the donor's open leases declared (their admitted demand)",
)
# A pipeline's own figures (remote_gpu.dispatch, remote_gpu.workloads): what an HPA on
# the blocks scales by (docs/metrics.md).
PIPELINE_QUEUE = Gauge("remote_gpu_pipeline_queue_frames", "Frames waiting for a block")
PIPELINE_FPS = Gauge(
    "remote_gpu_pipeline_frames_per_second", "Frames/s the pipeline's results came out at"
)
PIPELINE_FRAMES = Counter(
    "remote_gpu_pipeline_frames_total", "Frames answered, by the block that answered", ["block"]
)
PIPELINE_DROPPED = Counter(
    "remote_gpu_pipeline_dropped_frames_total", "Frames dropped: the queue was full"
)
