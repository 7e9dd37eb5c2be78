"""What the donor reads of a claim's opaque config: the latency SLO of its remote calls
and its QoS profile.

    config:
    - requests: [gpu]
      opaque:
        driver: gpu.composable.dra.io
        parameters:
          apiVersion: gpu.composable.dra.io/v1alpha1
          kind: GpuConfig
          latencySLO: {function: matmul, seconds: 0.05}
          qos: {transfer: 0.5, tolerance: 0.1, hostLoad: 0.2}

The plugin validates the whole ``GpuConfig`` at prepare (``dra_driver/config.py``); the
donor reads ``latencySLO`` and ``qos`` when the lease controller opens the claim's lease:
the first to admit the lease or refuse it (``slo.admit``), the second to report the
lease's profile to its node's plugin, which keeps the host headroom it needs
(``qos.headroom``). Shared here because neither component may import the other.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from composable_dra import kube_json
from composable_dra.lending import qos, slo

# An allow-list name of a donor (``--allow NAME=MODULE:FUNCTION``, or the import path).
FUNCTION_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$"


class SLOConfigError(ValueError):
    """A claim whose latency SLO cannot be read."""


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


def _applies(requests: Any, request: str) -> bool:
    """A config for no request names applies to all; ``r`` also to ``r``'s subrequests."""
    if not isinstance(requests, list) or not all(isinstance(r, str) for r in requests):
        raise SLOConfigError("config requests must be a list of request names")
    return not requests or any(request == r or request.startswith(r + "/") for r in requests)


def _request_of(allocation: dict[str, Any], driver: str, pool: str, device: str) -> str | None:
    results = (allocation.get("devices") or {}).get("results") or []
    if not isinstance(results, list):
        raise SLOConfigError("allocation results must be a list")
    for r in results:
        if isinstance(r, dict) and (r.get("driver"), r.get("pool"), r.get("device")) == (
            driver,
            pool,
            device,
        ):
            request = r.get("request")
            return request if isinstance(request, str) else None
    return None


def _parameter(claim: Any, driver: str, pool: str, device: str, key: str) -> tuple[bool, Any]:
    """Whether ``pool/device`` is allocated to ``claim``, and the last value of ``key`` in
    our driver's configs that apply to its request (None: none sets it). Configs from the
    class come first, the claim's win. SLOConfigError when the claim's configs are
    malformed."""
    if not isinstance(claim, dict):
        raise SLOConfigError("the claim is not an object")
    allocation = (claim.get("status") or {}).get("allocation") or {}
    if not isinstance(allocation, dict):
        raise SLOConfigError("the claim's allocation is not an object")
    request = _request_of(allocation, driver, pool, device)
    if request is None:
        return False, None
    configs = (allocation.get("devices") or {}).get("config") or []
    if not isinstance(configs, list) or not all(isinstance(c, dict) for c in configs):
        raise SLOConfigError("every device config must be an object")
    ordered = sorted(
        enumerate(configs), key=lambda ic: (0 if ic[1].get("source") == "FromClass" else 1, ic[0])
    )
    found: Any = None
    for _, cfg in ordered:
        opaque = cfg.get("opaque") or {}
        if not isinstance(opaque, dict) or opaque.get("driver") != driver:
            continue
        if not _applies(cfg.get("requests") or [], request):
            continue
        parameters = opaque.get("parameters")
        if isinstance(parameters, dict) and parameters.get(key) is not None:
            found = parameters[key]
    if kube_json.cut_paths(found, limit=1):
        raise SLOConfigError(f"{key} nests deeper than {kube_json.MAX_DEPTH} levels: not read")
    return True, found


def lease_of_claim(claim: Any, driver: str, pool: str, device: str) -> slo.Lease | None:
    """The SLO lease of the allocated ``pool/device`` of ``claim`` (None: the device is
    not allocated to it); the last ``latencySLO`` that applies to the device's request
    counts. SLOConfigError when the claim's configs are malformed."""
    allocated, value = _parameter(claim, driver, pool, device, "latencySLO")
    if not allocated:
        return None
    if value is None:
        return slo.Lease(function="")
    found = parse_slo(value)
    return slo.Lease(function=found.function, slo_s=found.seconds)


def qos_of_claim(claim: Any, driver: str, pool: str, device: str) -> QosConfig | None:
    """The QoS profile the claim declares for its allocated ``pool/device`` (None: none,
    or the device is not allocated to it). SLOConfigError when it cannot be read."""
    _, value = _parameter(claim, driver, pool, device, "qos")
    if value is None:
        return None
    try:
        return QosConfig.model_validate(value)
    except ValidationError as exc:
        raise SLOConfigError(f"invalid qos: {problems(exc, 'qos')}") from None


def problems(exc: ValidationError, root: str) -> str:
    """A validation error as one readable line: each field's path and what is wrong."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or root}: {e['msg']}" for e in exc.errors()
    )


def parse_slo(value: Any) -> LatencySLO:
    try:
        return LatencySLO.model_validate(value)
    except ValidationError as exc:
        raise SLOConfigError(f"invalid latencySLO: {problems(exc, 'latencySLO')}") from None
