"""Names shared by the components (docs/architecture.md, Names). Defaults; all are configurable."""

from __future__ import annotations

DRIVER = "gpu.composable.dra.io"
DEVICE_CLASS = "composable-gpu"
# A node's own GPUs only: the `local` alternative of a claim that prefers them.
LOCAL_DEVICE_CLASS = "composable-gpu-local"
PREFIX = "composable.dra.io"

# Binding conditions on pool devices (KEP-5007).
FABRIC_DEVICE_READY = "FabricDeviceReady"
FABRIC_DEVICE_FAILED = "FabricDeviceFailed"
FABRIC_DEVICE_RESCHEDULE = "FabricDeviceReschedule"
# Event reason: a claim with parts nested deeper than the suite reads (kube_json.MAX_DEPTH).
NESTED_TOO_DEEP = "NestedTooDeep"

# Conditions on ComposableResource.
DEVICE_VISIBLE = "DeviceVisible"  # written by the node's kubelet plugin
ATTACHED = "Attached"  # written by the operator
READY = "Ready"  # written by the operator: Online
# The host-side release before a detach (docs/attach-flow.md, Detach): the operator asks
# (True, once the device is tainted and no claim holds it), the node's plugin answers.
RELEASE_REQUESTED = "ReleaseRequested"  # written by the operator
HOST_RELEASED = "HostReleased"  # written by the node's kubelet plugin

# Labels and annotations.
LABEL_NODE = f"{PREFIX}/node"
LABEL_FABRIC = f"{PREFIX}/fabric"
LABEL_CLAIM_UID = f"{PREFIX}/claim-uid"
LABEL_REQUEST = f"{PREFIX}/request"
FINALIZER = f"{PREFIX}/detach"
TAINT_KEY = f"{PREFIX}/detaching"
# The scaler's, on the ComposableResources it creates and the taint rules it writes.
ANN_POOL = f"{PREFIX}/pool"
ANN_POOL_DEVICE = f"{PREFIX}/pool-device"
ANN_IN_USE_BY = f"{PREFIX}/in-use-by"
ANN_EXPIRES = f"{PREFIX}/expires-at"
QUARANTINE_LABEL = f"{PREFIX}/quarantine"
# Set by a person on a ComposableResource to fence its GPU by hand (the value says why):
# the GPU is Unhealthy (Quarantined), tainted NoSchedule, until the annotation goes.
ANN_FENCE = f"{PREFIX}/fence"
# Set by the operator on the resources it creates for orphans; "adopt": the scaler keeps
# them, idle like any GPU it attached.
ANN_ADOPTED = f"{PREFIX}/adopted"


def pool_name(fabric: str, zone: str) -> str:
    """The ResourceSlice pool of a fabric zone's free devices: '<fabric>/<zone>'."""
    return f"{fabric}/{zone.lower()}"


def normalize_uuid(value: str) -> str:
    """One GPU's identity across sources: NVML says 'GPU-<uuid>', Redfish the bare UUID."""
    value = value.strip().lower()
    return value[4:] if value.startswith("gpu-") else value


def nvidia_gpu_id(value: str) -> str:
    """The name the NVIDIA container runtime knows a GPU by (NVML's 'GPU-<uuid>'), whichever
    source reported it: Redfish gives the bare UUID, which NVIDIA_VISIBLE_DEVICES would miss."""
    return "GPU-" + normalize_uuid(value)
