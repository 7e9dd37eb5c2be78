"""The plugin (at prepare) and the donor (when it opens a lease) read a claim's QoS
profile and latency SLO alike (issue 25.11): one reading, ``gpu_config.claim_configs``.

Before, the donor skipped a null and read any parameters, so a claim's ``qos: null``
over its class's profile, or a config of another apiVersion/kind, meant one thing to the
plugin and another to the donor.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.v1alpha1 import ClaimRef
from dra_driver.prepare import ClaimError, plan_claim
from remote_gpu.claim_config import lease_of_claim, qos_of_claim
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, gpu, gpu_config

PROFILE = {"transfer": 0.5, "tolerance": 0.1, "hostLoad": 0.2}
REF = ClaimRef(namespace="ns", name="c", uid="uid-1")


def claim(*configs: dict[str, Any]) -> dict[str, Any]:
    result = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}
    return {
        "metadata": {"uid": REF.uid},
        "status": {"allocation": {"devices": {"results": [result], "config": list(configs)}}},
    }


def config(parameters: Any, source: str = "FromClaim", requests: Any = None) -> dict[str, Any]:
    out = {"source": source, "opaque": {"driver": DRIVER, "parameters": parameters}}
    if requests is not None:
        out["requests"] = requests
    return out


def plugin_reads(c: dict[str, Any]) -> Any:
    """What the plugin prepares with: the QoS profile and SLO, or 'refused'."""
    try:
        [planned] = plan_claim(c, REF, DRIVER, NODE, [gpu(0)], {})
    except ClaimError:
        return "refused"
    return planned.config.qos, planned.config.latencySLO


def donor_reads(c: dict[str, Any]) -> Any:
    """What the donor opens the lease with: the QoS profile and SLO, or 'refused'."""
    try:
        profile = qos_of_claim(c, DRIVER, NODE, "gpu-0")
        lease = lease_of_claim(c, DRIVER, NODE, "gpu-0")
    except ValueError:
        return "refused"
    assert lease is not None
    slo = None if not lease.function else (lease.function, lease.slo_s)
    return profile, slo


def _same(c: dict[str, Any]) -> None:
    plugin, donor = plugin_reads(c), donor_reads(c)
    if plugin == "refused" or donor == "refused":
        assert plugin == donor, (plugin, donor)
        return
    assert plugin[0] == donor[0]
    slo = plugin[1]
    assert (None if slo is None else (slo.function, slo.seconds)) == donor[1]


def test_a_claims_null_profile_drops_its_class_profile_for_both() -> None:
    c = claim(
        config(gpu_config(qos=PROFILE), source="FromClass"),
        config(gpu_config(qos=None)),
    )
    assert plugin_reads(c)[0] is None
    assert donor_reads(c)[0] is None


@pytest.mark.parametrize(
    "parameters",
    [
        {"apiVersion": "example.com/v1", "kind": "GpuConfig", "qos": PROFILE},
        {"apiVersion": "gpu.composable.dra.io/v1alpha1", "kind": "Other", "qos": PROFILE},
        {"qos": PROFILE},
        gpu_config(qos=PROFILE, sharing="Sometimes"),
    ],
)
def test_a_config_the_plugin_refuses_the_donor_refuses(parameters: dict[str, Any]) -> None:
    c = claim(config(parameters))
    assert plugin_reads(c) == "refused"
    assert donor_reads(c) == "refused"


_qos = st.sampled_from([None, PROFILE, {**PROFILE, "tolerance": 0.5}, {"transfer": -1}])
_slo = st.sampled_from([None, {"function": "matmul", "seconds": 0.05}, {"function": "m"}])
_parameters = st.builds(
    lambda api, kind, fields: {"apiVersion": api, "kind": kind, **fields},
    st.sampled_from(["gpu.composable.dra.io/v1alpha1", "example.com/v1"]),
    st.sampled_from(["GpuConfig", "GpuConfig", "Other"]),
    st.fixed_dictionaries({}, optional={"qos": _qos, "latencySLO": _slo}),
)
_config = st.builds(
    config,
    _parameters,
    st.sampled_from(["FromClass", "FromClaim"]),
    st.sampled_from([None, [], ["gpu"], ["other"]]),
)


@settings(max_examples=300)
@given(configs=st.lists(_config, max_size=4))
def test_fuzz_the_plugin_and_the_donor_read_alike(configs: list[dict[str, Any]]) -> None:
    _same(claim(*configs))
