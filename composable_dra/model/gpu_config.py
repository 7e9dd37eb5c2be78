"""Opaque device configuration addressed to our driver (``opaque.parameters``), and how a
claim's configs for one request merge: the one reading of them, by the plugin at prepare
(``dra_driver/prepare.py``) and by the donor when it opens a lease
(``remote_gpu/claim_config.py``), so both see the same SLO and QoS profile.

Example, in a claim's ``spec.devices.config`` or a DeviceClass's ``spec.config``::

    opaque:
      driver: gpu.composable.dra.io
      parameters:
        apiVersion: gpu.composable.dra.io/v1alpha1
        kind: GpuConfig
        sharing: Shared          # Exclusive (default) | Shared
        env: {MY_VAR: value}     # extra environment for the containers
        latencySLO:              # remote devices: each call of this function within
          function: matmul       # this many seconds; the donor offers no lease that
          seconds: 0.05          # would break it (docs/lending-policy.md)
        qos:                     # the claim's QoS profile: the node keeps the host
          transfer: 0.5          # headroom it needs (hostHeadroom; composable-dra
          tolerance: 0.1         # qos-selector writes the matching selector)
          hostLoad: 0.2
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from composable_dra.k8s import kube_json
from composable_dra.lending import qos
from composable_dra.model.validation import problems

API_VERSION = "gpu.composable.dra.io/v1alpha1"
KIND = "GpuConfig"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # fullmatch: no trailing newline
# A NUL cannot be in a process's environment; a line break would split the CDI spec's
# "NAME=value" entry for any runtime that reads it line by line.
_BAD_VALUE_CHARS = ("\x00", "\n", "\r")
_RESERVED_PREFIXES = ("COMPOSABLE_GPU_", "NVIDIA_VISIBLE_DEVICES")


# An allow-list name of a donor (``--allow NAME=MODULE:FUNCTION``, or the import path).
FUNCTION_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$"


class ConfigError(ValueError):
    """A claim's config for our driver that cannot be read."""


class LatencySLO(BaseModel):
    """Every call of ``function`` through the lease should take at most ``seconds``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    function: str = Field(pattern=FUNCTION_NAME)
    seconds: float = Field(gt=0, le=3600, allow_inf_nan=False)


class QosConfig(BaseModel):
    """A claim's QoS profile (``qos.QosProfile``), declared so that the node running it
    keeps the host headroom the claim needs: later claims that would push the host past
    its tolerance are not offered this node's devices (``hostHeadroom``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    transfer: float = Field(ge=0, le=10, allow_inf_nan=False)
    tolerance: float = Field(gt=0, le=10, allow_inf_nan=False)
    host_load: float = Field(default=0.0, alias="hostLoad", ge=0, le=1, allow_inf_nan=False)

    def profile(self) -> qos.QosProfile:
        return qos.QosProfile(self.transfer, self.tolerance, self.host_load)


class GpuConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    apiVersion: Literal["gpu.composable.dra.io/v1alpha1"] = "gpu.composable.dra.io/v1alpha1"
    kind: Literal["GpuConfig"] = "GpuConfig"
    sharing: Literal["Exclusive", "Shared"] = "Exclusive"
    env: dict[str, str] = Field(default_factory=dict)
    latencySLO: LatencySLO | None = None
    qos: QosConfig | None = None

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name, val in value.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
            if name.startswith(_RESERVED_PREFIXES):
                raise ValueError(f"{name!r} is set by the driver and cannot be overridden")
            if any(c in val for c in _BAD_VALUE_CHARS):
                raise ValueError(f"the value of {name} contains a NUL or a line break")
        return value


def parse_parameters(parameters: Any) -> GpuConfig:
    """Validate one ``opaque.parameters`` object; ConfigError with a readable message."""
    if not isinstance(parameters, dict):
        raise ConfigError("opaque parameters must be an object")
    cut = kube_json.cut_paths(parameters, limit=1)
    if cut:
        raise ConfigError(
            f"opaque parameters nest deeper than {kube_json.MAX_DEPTH} levels"
            f" (at parameters{cut[0]}): not read"
        )
    api_version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if api_version != API_VERSION or kind != KIND:
        raise ConfigError(
            f"unsupported config {api_version}/{kind}: this driver accepts {API_VERSION} {KIND}"
        )
    try:
        return GpuConfig.model_validate(parameters)
    except ValidationError as exc:
        raise ConfigError(f"invalid {KIND}: {problems(exc, 'config')}") from None


class RequestConfigs:
    """The configs of one claim for our driver, in precedence order (class, then claim)."""

    def __init__(self, entries: Sequence[tuple[tuple[str, ...], GpuConfig]]) -> None:
        self._entries = list(entries)

    def for_request(self, request: str) -> GpuConfig:
        """Merge every config that applies to ``request``; later entries win per field,
        also where they set it to null (a claim's ``qos: null`` drops its class's profile)."""
        merged: dict[str, Any] = {}
        env: dict[str, str] = {}
        for requests, cfg in self._entries:
            if requests and not any(request == r or request.startswith(r + "/") for r in requests):
                continue
            merged.update(cfg.model_dump(exclude_unset=True, exclude={"env"}))
            env.update(cfg.env)
        return GpuConfig.model_validate(
            {**merged, "apiVersion": API_VERSION, "kind": KIND, "env": env}
        )


def claim_configs(allocation_configs: Sequence[dict[str, Any]], driver: str) -> RequestConfigs:
    """Our driver's configs from ``status.allocation.devices.config``; others are ignored.

    Configs from the class come before configs from the claim, so the claim wins.
    """
    if not all(isinstance(cfg, dict) for cfg in allocation_configs):
        raise ConfigError("every device config must be an object")
    ordered = sorted(
        enumerate(allocation_configs),
        key=lambda ic: (0 if ic[1].get("source") == "FromClass" else 1, ic[0]),
    )
    entries = []
    for _, cfg in ordered:
        opaque = cfg.get("opaque") or {}
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        requests = cfg.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
            raise ConfigError("config requests must be a list of request names")
        entries.append((tuple(requests), parse_parameters(opaque.get("parameters"))))
    return RequestConfigs(entries)
