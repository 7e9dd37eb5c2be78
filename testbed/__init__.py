"""The local test cluster: what the end-to-end tests, the benchmarks and the demo all start.

A real Kubernetes control plane built from source (``controlplane``), the suite's
components as processes beside it (``harness``: the fabric emulator, the operator, the
pool publisher, the scaler, a plugin per node), the nodes themselves (kubelet emulators,
``kubelet_emulator``; or real kubelets with containerd, ``realnode``), and the helpers the
tests use to drive and read it (``objects``, ``wait``, ``claims_seen``, ``realnodes``).
Not shipped: it imports the product, never the other way round, and never imports
``tests`` or ``hack``.
"""

from testbed.controlplane import ControlPlane, ControlPlaneError

__all__ = ["ControlPlane", "ControlPlaneError"]
