"""A real Kubernetes control plane on one machine, with fake nodes and kubelet emulators.

Used by the end-to-end tests and by the local demo.
"""

from hack.localcluster.controlplane import ControlPlane, ControlPlaneError

__all__ = ["ControlPlane", "ControlPlaneError"]
