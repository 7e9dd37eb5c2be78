"""Lending policy: the pure decisions behind which remote GPUs the scheduler may hand out.

`netaware` says when a donor's link is too busy for network-sensitive claims (the
network-aware policy, as a device taint); `slo` fits per-function latency models and
sizes a donor's lease capacity so that every admitted lease keeps its latency SLO. The
plugin, the donor and the simulator under ``hack/sim/`` all call these same functions.
"""
