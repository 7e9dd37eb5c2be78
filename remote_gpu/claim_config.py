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

The donor reads ``latencySLO`` and ``qos`` when the lease controller opens the claim's
lease: the first to admit the lease or refuse it (``slo.admit``), the second to report the
lease's profile to its node's plugin, which keeps the host headroom it needs
(``qos.headroom``). It reads them as the plugin does at prepare, through
``gpu_config.claim_configs`` (shared because neither component may import the other):
the same precedence, the same ``qos: null``, the same refusal of another apiVersion/kind.
"""

from __future__ import annotations

from typing import Any

from composable_dra.model.gpu_config import ConfigError, GpuConfig, QosConfig, claim_configs
from remote_gpu import slo


class SLOConfigError(ConfigError):
    """A claim whose configs for its remote device cannot be read."""


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


def config_of_claim(claim: Any, driver: str, pool: str, device: str) -> GpuConfig | None:
    """Our driver's config for the request of the allocated ``pool/device`` of ``claim``
    (None: the device is not allocated to it), merged as the plugin merges it at prepare.
    ConfigError when the claim's configs are malformed."""
    if not isinstance(claim, dict):
        raise SLOConfigError("the claim is not an object")
    allocation = (claim.get("status") or {}).get("allocation") or {}
    if not isinstance(allocation, dict):
        raise SLOConfigError("the claim's allocation is not an object")
    request = _request_of(allocation, driver, pool, device)
    if request is None:
        return None
    configs = (allocation.get("devices") or {}).get("config") or []
    if not isinstance(configs, list):
        raise SLOConfigError("allocation configs must be a list")
    return claim_configs(configs, driver).for_request(request)


def lease_of_claim(claim: Any, driver: str, pool: str, device: str) -> slo.Lease | None:
    """The SLO lease of the allocated ``pool/device`` of ``claim`` (None: the device is
    not allocated to it); the ``latencySLO`` that wins for the device's request counts.
    ConfigError when the claim's configs are malformed."""
    config = config_of_claim(claim, driver, pool, device)
    if config is None:
        return None
    found = config.latencySLO
    if found is None:
        return slo.Lease(function="")
    return slo.Lease(function=found.function, slo_s=found.seconds)


def qos_of_claim(claim: Any, driver: str, pool: str, device: str) -> QosConfig | None:
    """The QoS profile the claim declares for its allocated ``pool/device`` (None: none,
    or the device is not allocated to it). ConfigError when it cannot be read."""
    config = config_of_claim(claim, driver, pool, device)
    return None if config is None else config.qos
