"""Remote-GPU lending as more than one component sees it.

`netaware` says when a donor's link is too busy for network-sensitive claims (the
network-aware policy, as a device taint; the plugin and the donor); `qos` turns a claim's
QoS profile into host headroom and a device selector (the plugin, ``qos-selector`` and
GpuConfig); `remote_leases` is the donor's lease API as the scaler, the plugin and the
donor see it. The simulator under ``hack/sim/`` calls these same functions. What only the
donor decides (``remote_gpu/slo.py``) lives in the donor.
"""
