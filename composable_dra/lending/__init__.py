"""Remote-GPU lending as more than one component sees it.

`netaware` says when a donor's link is too busy for network-sensitive claims (the
network-aware policy, as a device taint); `qos` turns a claim's QoS profile into host
headroom and a device selector; `slo` fits per-function latency models and sizes a
donor's lease capacity so that every admitted lease keeps its latency SLO;
`remote_leases` is the donor's lease API as the scaler, the plugin and the donor see it.
The plugin, the donor and the simulator under ``hack/sim/`` all call these same functions.
"""
