"""The suite's custom resources, group composable.dra.io, version v1alpha1.

Defined once here with pydantic; `python -m api.crdgen` turns them into the CRD
manifests in deploy/crds/. CEL rules (``x-kubernetes-validations``) live next to the
fields they guard, so the API server refuses bad specs before any controller sees them.
Controllers parse objects with these models to read them, and write status through
merge patches of plain dicts (never whole objects).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import pydantic.dataclasses
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from api import labels

GROUP = "composable.dra.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = f"^{labels.DNS_SUBDOMAIN}$"
# A Redfish resource Id that is one URL path segment as it stands: no '/', '?', '#', '%',
# space, and never '.' or '..' (it cannot start with a dot).
DEVICE_ID = r"^[A-Za-z0-9_-][A-Za-z0-9._:-]*$"
# http(s)://host[:port][/path]: no userinfo (credentials belong in credentialsSecret).
ENDPOINT = r"^https?://[^\s/?#@]+([/?#]\S*)?$"
_ENDPOINT_USERINFO = r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@"


def _rules(*rules: tuple[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


def _immutable(field: str) -> dict[str, Any]:
    return _rules(("self == oldSelf", f"{field} is immutable"))


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class SecretRef(_Model):
    """A Secret in a namespace (the custom resources are cluster-scoped)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    namespace: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)


class NodeMapping(_Model):
    """How a Kubernetes node is matched to the fabric's host (ComputerSystem)."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "!has(self.by) || self.by != 'annotation' || has(self.annotation)",
                "annotation is required when by is 'annotation'",
            ),
        )
    )

    by: Literal["systemUUID", "providerID", "annotation"] = Field(
        default="systemUUID",
        description="systemUUID: node.status.nodeInfo.systemUUID equals the host's UUID; "
        "providerID: the node's spec.providerID ends with the host's Id; annotation: "
        "the node's annotation (named below) holds the host's Id.",
    )
    annotation: str | None = Field(default=None, min_length=1, max_length=317)


_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = f"^({labels.DNS_SUBDOMAIN}/)?{_LABEL_NAME}$"
_LABEL_VALUE = f"^({_LABEL_NAME})?$"


class ZoneNodeLabel(_Model):
    """A node label (key=value) that the admin put on exactly the nodes a zone reaches."""

    key: str = Field(min_length=1, max_length=317, pattern=_LABEL_KEY)
    value: str = Field(default="true", max_length=63, pattern=_LABEL_VALUE)

    @field_validator("key", "value")
    @classmethod
    def _label_syntax(cls, text: str, info: ValidationInfo) -> str:
        # The patterns above miss the prefix's 253-character limit; say what is wrong.
        check = labels.key_problem if info.field_name == "key" else labels.value_problem
        if (why := check(text)) is not None:
            raise ValueError(why)
        return text


class FsasSettings(_Model):
    """What the Fujitsu/Fsas CDI fabric manager needs besides credentials (docs/fabrics.md)."""

    tenant_uuid: str = Field(
        alias="tenantUUID", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$"
    )
    realm: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="The ID manager's realm that issues the OAuth token.",
    )
    attach_by: Literal["resource", "model"] = Field(
        default="resource",
        alias="attachBy",
        description="resource: the FM lists GPUs by identity and attaches the one named; "
        "model: the FM attaches a GPU of the model that it picks and lists free capacity "
        "as counts (as CoHDI's FM client and CI mock do); pools then publish "
        "interchangeable slots (docs/fabrics.md).",
    )
    models: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list,
        max_length=32,
        description="attachBy model: the GPU models whose free counts the pools publish.",
    )


# The CRD's approximation of `labels.names_something` (the field is a free string): some
# requirement, between commas, is key=value or key==value with a value.
_NAMES_A_LABEL = (
    r"self.matches('(^|,)\\s*[A-Za-z0-9][-A-Za-z0-9_./]*\\s*==?\\s*"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\\s*(,|$)')"
)


class VendorRestart(_Model):
    """Which pods run the vendor's kubelet plugin, to restart after an attach."""

    namespace: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    pod_selector: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[A-Za-z0-9./_=!,() -]+$",
        description="A label selector that names the plugin's pods with at least one "
        "key=value (NVIDIA's: 'app.kubernetes.io/name=dra-driver-nvidia-gpu,"
        "dra-driver-nvidia-gpu-component=kubelet-plugin'); the scaler deletes the matching "
        "pods on the GPU's node once the GPU is attached.",
        json_schema_extra=_rules(
            (_NAMES_A_LABEL, "podSelector must name the plugin's pods with a key=value")
        ),
    )

    @field_validator("pod_selector")
    @classmethod
    def _names_the_plugin(cls, value: str) -> str:
        # Refused, not trusted: '!x' or 'a!=b' would select every pod of the namespace on
        # the node, and the scaler deletes what it selects.
        if not labels.names_something(labels.parse_selector(value)):
            raise ValueError(
                f"podSelector {value!r} must name the plugin's pods with at least one key=value"
            )
        return value


class VendorDriver(_Model):
    """Vendor-driver mode (docs/operations.md): the pool is published under another
    driver's name, and the attach completes with FabricDeviceReschedule once that driver's
    node slice lists the GPU, instead of FabricDeviceReady with our own plugin."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=DNS_SUBDOMAIN,
        description="The vendor's DRA driver name, e.g. gpu.nvidia.com.",
    )
    attribute_names: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        description="Our pool attribute name -> the vendor's (e.g. productName: "
        "productName); attributes not named keep our names.",
    )
    attributes: dict[str, str] = Field(
        default_factory=dict,
        max_length=16,
        description="Extra string attributes every pool device carries, so that the "
        "vendor's DeviceClass selects it (e.g. type: gpu).",
    )
    restart: VendorRestart | None = Field(
        default=None,
        description="Restart the vendor plugin after an attach, for drivers that do not "
        "see hot-plugged GPUs. Without it the scaler waits for the driver to publish it.",
    )
    restart_retry_seconds: int = Field(
        default=30,
        ge=5,
        le=3600,
        description="Restart again when the GPU is still not in the driver's slice after this.",
    )


class StandbyPolicy(_Model):
    """Warm standby (docs/operations.md): idle GPUs kept attached to the nodes of each of
    the fabric's zones, so that claims find a local GPU with no binding wait. The number
    kept per zone follows the recent claim arrivals: arrivals in the window times the
    expected attach time, clamped to minPerZone..maxPerZone."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "!has(self.minPerZone) || self.minPerZone <= self.maxPerZone",
                "minPerZone must not exceed maxPerZone",
            ),
        )
    )

    max_per_zone: int = Field(
        ge=0, le=1024, description="The most idle GPUs standby keeps attached in one zone."
    )
    min_per_zone: int = Field(
        default=0, ge=0, le=1024, description="Idle GPUs kept in each zone whatever the demand."
    )
    window_seconds: int = Field(
        default=300,
        ge=10,
        le=86400,
        description="How far back claim arrivals are counted.",
    )
    attach_seconds: int = Field(
        default=30,
        ge=1,
        le=3600,
        description="The expected time of one attach: the standby covers the claims that "
        "arrive while a pool GPU would be attaching.",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Keep GPUs of this model only; unset: any model of the zone.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> StandbyPolicy:
        if self.min_per_zone > self.max_per_zone:
            raise ValueError("minPerZone must not exceed maxPerZone")
        return self


class FabricSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "self.backend != 'fsas-fm' || has(self.fsas)",
                "fsas (tenantUUID, realm) is required when backend is 'fsas-fm'",
            ),
            (
                "!has(self.standby) || !has(self.vendorDriver)",
                "standby needs the suite's own kubelet plugin: not with vendorDriver",
            ),
        )
    )

    backend: Literal["redfish-composition", "redfish-zones", "fsas-fm"] = Field(
        description="The fabric manager's API: 'redfish-composition' attaches with the "
        "ComputerSystem AddResourceBlock/RemoveResourceBlock actions; 'redfish-zones' by "
        "PATCHing the system's Links.ResourceBlocks (guarded by If-Match), for fabric "
        "managers without those actions. Both read ResourceZones for reachability. "
        "'fsas-fm': the Fujitsu/Fsas CDI fabric manager API, with an OAuth token "
        "(credentialsSecret also holds client_id and client_secret; see fsas)."
    )
    fsas: FsasSettings | None = Field(
        default=None, description="Settings of the 'fsas-fm' backend (tenant, realm)."
    )
    endpoint: str = Field(
        pattern=ENDPOINT,
        max_length=2048,
        description="Base URL of the fabric manager, e.g. https://fabric.example:8443; "
        "no user:password@ (credentials go in credentialsSecret).",
        json_schema_extra=_rules(
            (
                f"!self.matches('{_ENDPOINT_USERINFO}')",
                "endpoint must not carry credentials (user:password@host): put them in "
                "credentialsSecret",
            )
        ),
    )
    credentials_secret: SecretRef = Field(
        description="Secret with keys 'username' and 'password' for the fabric manager."
    )
    ca_secret: SecretRef | None = Field(
        default=None,
        description="Secret with key 'ca.crt' that verifies the fabric manager's "
        "certificate. Without it the system trust store is used.",
    )
    insecure_skip_tls_verify: bool = Field(
        alias="insecureSkipTLSVerify",
        default=False,
        description="Do not verify the fabric manager's certificate. For labs only.",
    )
    node_mapping: NodeMapping = Field(default_factory=NodeMapping)
    poll_interval_seconds: int = Field(default=30, ge=5, le=3600)
    zone_node_labels: dict[str, ZoneNodeLabel] = Field(
        default_factory=dict,
        max_length=256,
        description="Zone id -> a node label that exactly the zone's nodes carry. The "
        "pool publisher then selects the zone's nodes by that one label instead of a list "
        "of hostnames (far cheaper for kube-scheduler at scale); while the nodes carrying "
        "it differ from the nodes the zone reaches, it falls back to the hostname list.",
    )
    operation_timeout_seconds: int = Field(
        default=300, ge=10, le=3600, description="Give up on an attach or detach after this."
    )
    orphan_policy: Literal["Adopt", "Detach", "Ignore"] = Field(
        default="Adopt",
        description="What to do with a device the fabric shows attached to one of our "
        "nodes with no ComposableResource for longer than orphanGracePeriodSeconds: "
        "Adopt (manage it from then on: published once, detached when idle), Detach "
        "(back to the pool, after the usual taint and allocation check), or Ignore.",
    )
    orphan_grace_period_seconds: int = Field(default=300, ge=0, le=86400)
    standby: StandbyPolicy | None = Field(
        default=None,
        description="Warm standby: keep idle GPUs attached in each zone, sized from the "
        "recent claim arrivals (docs/operations.md). Unset: none. Not with vendorDriver.",
    )
    vendor_driver: VendorDriver | None = Field(
        default=None,
        description="Vendor-driver mode: publish this fabric's pools under a vendor's DRA "
        "driver and complete attaches by rescheduling onto it (docs/operations.md). "
        "Unset: the one-cycle path with our own kubelet plugin.",
    )

    @field_validator("endpoint", mode="before")
    @classmethod
    def _no_credentials(cls, value: Any) -> Any:
        # Before the pattern, so the message says what is wrong.
        if isinstance(value, str) and re.match(_ENDPOINT_USERINFO, value):
            raise ValueError(
                "endpoint must not carry credentials (user:password@host): put them in "
                "credentialsSecret"
            )
        return value


class Condition(_Model):
    """metav1.Condition."""

    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(default="", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"}
    )
    observed_generation: int | None = Field(default=None, ge=0)


class ModelCount(_Model):
    model: str
    zone: str | None = None
    count: int = Field(ge=0)


class FabricStatus(_Model):
    reachable: bool | None = None
    free_devices: list[ModelCount] = Field(default_factory=list)
    last_sync_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    conditions: list[Condition] = Field(default_factory=list)


# A ResourceClaim by namespace, name and UID: the one type for it, in a ComposableResource's
# spec, in the plugin's prepare calls and in the scaler's actions. A validating dataclass
# rather than a model: hashable, built positionally. (No docstring: it would become the
# CRD field's description.)
@pydantic.dataclasses.dataclass(frozen=True)
class ClaimRef:
    namespace: Annotated[str, Field(min_length=1, max_length=63)]
    name: Annotated[str, Field(min_length=1, max_length=253)]
    uid: Annotated[str, Field(min_length=1, max_length=64)]


Phase = Literal["Attaching", "Online", "Detaching", "Detached", "Failed"]


class ComposableResourceSpec(_Model):
    fabric: str = Field(
        min_length=1,
        max_length=253,
        description="Name of the Fabric",
        json_schema_extra=_immutable("fabric"),
    )
    device_id: str = Field(
        alias="deviceID",
        min_length=1,
        max_length=253,
        pattern=DEVICE_ID,
        description="The fabric's id of the device (Redfish ResourceBlock Id).",
        json_schema_extra=_immutable("deviceID"),
    )
    model: str | None = Field(default=None, max_length=256)
    target_node: str = Field(
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="The node the device is attached to.",
        json_schema_extra=_immutable("targetNode"),
    )
    claim_ref: ClaimRef | None = Field(
        default=None, description="The ResourceClaim the device was attached for, if any."
    )
    force_detach: bool = Field(
        default=False,
        description="Detach even while a claim allocation references the device or its"
        " node's host has not released it (a Warning Event ForcedDetach records it).",
    )


class PendingAttach(_Model):
    """An attach request the operator sent, recorded as it goes out (docs/attach-flow.md)."""

    host: str = Field(max_length=1024, description="The fabric host the request names")
    requested_at: str = Field(json_schema_extra={"format": "date-time"})
    task_monitor: str | None = Field(
        default=None, max_length=2048, description="The fabric's task monitor, once answered"
    )
    task: str | None = Field(default=None, max_length=2048, description="The fabric's task")
    machine_resources: list[Annotated[str, Field(max_length=253)]] | None = Field(
        default=None,
        max_length=256,
        description="A fabric that picks the device: the host's devices before the request, "
        "to find the picked one again when the answer was lost",
    )


class ComposableResourceStatus(_Model):
    phase: Phase | None = None
    device_uuid: str | None = Field(
        default=None, alias="deviceUUID", description="The device's UUID as its node sees it"
    )
    fabric_host: str | None = Field(default=None, description="The fabric's id of the node's host")
    fabric_device_id: str | None = Field(
        default=None,
        alias="fabricDeviceID",
        max_length=253,
        description="A fabric that picks the device (Fsas attachBy model): the id of the "
        "device it attached; spec.deviceID is then the pool slot the claim allocated",
    )
    error: str | None = None
    attached_at: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    detached_at: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    last_used_at: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    observed_generation: int | None = None
    pending_attach: PendingAttach | None = None
    conditions: list[Condition] = Field(default_factory=list)


class ComposabilityRequestSpec(_Model):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            ("!has(self.minSize) || self.size >= self.minSize", "size must be at least minSize"),
            ("!has(self.maxSize) || self.size <= self.maxSize", "size must be at most maxSize"),
            (
                "!has(self.minSize) || !has(self.maxSize) || self.minSize <= self.maxSize",
                "minSize must not exceed maxSize",
            ),
        )
    )

    fabric: str = Field(min_length=1, max_length=253)
    model: str = Field(min_length=1, max_length=256, description="Device model to attach")
    target_node: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="Node to attach to; empty: any node the fabric reaches.",
    )
    size: int = Field(ge=0, le=1024, description="Desired number of devices")
    min_size: int | None = Field(default=None, ge=0, le=1024)
    max_size: int | None = Field(default=None, ge=0, le=1024)


class ComposabilityRequestStatus(_Model):
    resources: list[str] = Field(default_factory=list)
    online: int = 0
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


# Every kind's last printer column.
_AGE = ("Age", "date", ".metadata.creationTimestamp")


class KindInfo(BaseModel):
    """A custom resource kind as its CRD declares it (api/crdgen.py)."""

    kind: str
    short_names: list[str]
    spec: type[_Model]
    status: type[_Model]
    columns: list[tuple[str, str, str]]  # kubectl's columns: name, type, JSON path; then Age
    selectable_fields: list[str] = []

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def plural(self) -> str:
        return f"{self.singular}s"

    @property
    def printer_columns(self) -> list[dict[str, str]]:
        return [{"name": n, "type": t, "jsonPath": p} for n, t, p in [*self.columns, _AGE]]


KINDS = [
    KindInfo(
        kind="Fabric",
        short_names=["fab"],
        spec=FabricSpec,
        status=FabricStatus,
        columns=[
            ("Backend", "string", ".spec.backend"),
            ("Endpoint", "string", ".spec.endpoint"),
            ("Reachable", "boolean", ".status.reachable"),
            ("Last Sync", "date", ".status.lastSyncTime"),
        ],
    ),
    KindInfo(
        kind="ComposableResource",
        short_names=["cres"],
        spec=ComposableResourceSpec,
        status=ComposableResourceStatus,
        columns=[
            ("Phase", "string", ".status.phase"),
            ("Node", "string", ".spec.targetNode"),
            ("Model", "string", ".spec.model"),
            ("Device", "string", ".spec.deviceID"),
        ],
        # The node's plugin watches only the resources that target its node.
        selectable_fields=[".spec.targetNode", ".spec.fabric"],
    ),
    KindInfo(
        kind="ComposabilityRequest",
        short_names=["creq"],
        spec=ComposabilityRequestSpec,
        status=ComposabilityRequestStatus,
        columns=[
            ("Model", "string", ".spec.model"),
            ("Node", "string", ".spec.targetNode"),
            ("Size", "integer", ".spec.size"),
            ("Online", "integer", ".status.online"),
        ],
    ),
]
