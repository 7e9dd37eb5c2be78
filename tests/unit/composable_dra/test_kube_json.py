"""Kubernetes JSON decoded within the API server's own limits (composable_dra/k8s/kube_json.py):
fuzzed over nesting depth up to the server's 10,000 levels and claims with up to 10 KiB of
opaque parameters."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from composable_dra.k8s import kube_json
from composable_dra.k8s.frozen import freeze
from composable_dra.k8s.kube import CUT_OBJECTS
from composable_dra.model import names
from composable_dra.model.gpu_config import ConfigError, claim_configs, parse_parameters
from device_scaler.scaler import Scaler, ScalerConfig
from remote_gpu.claim_config import lease_of_claim
from tests.unit.composable_dra.deep_claims import (
    BODY_DEPTH_MAX,
    DRIVER,
    GOOD,
    OPAQUE_MAX,
    claim,
    claim_list,
    kube,
    nested,
)
from tests.unit.device_scaler.test_scaler import CFG


@pytest.mark.parametrize("depth", [1000, 3000])
def test_a_cut_claim_is_counted_located_and_never_written_back(depth: int) -> None:
    before = CUT_OBJECTS.labels("ResourceClaim")._value.get()
    listed = claim_list(claim("good", GOOD), claim("bad", '{"a":' + nested(depth) + "}"))
    good, deep = kube(listed).get("/x")["items"]
    assert CUT_OBJECTS.labels("ResourceClaim")._value.get() == before + 1
    assert kube_json.cut_paths(good) == []
    spec_cut, status_cut = kube_json.cut_paths(deep)
    assert spec_cut.startswith(".spec.devices.config[0].opaque.parameters.a[0]")
    assert spec_cut.endswith("...")
    assert status_cut.startswith(".status.allocation.devices.config[0].opaque.parameters.a[0]")
    with pytest.raises(TypeError):  # TOO_DEEP is not JSON
        json.dumps(deep)
    with pytest.raises(ConfigError, match="nest deeper than 100 levels"):
        claim_configs(deep["status"]["allocation"]["devices"]["config"], DRIVER)


def test_deep_params_refuse_the_slo_by_name() -> None:
    raw = claim("bad", '{"kind":"GpuConfig","latencySLO":%s}' % nested(500, "{"))  # noqa: UP031
    with pytest.raises(
        ConfigError, match=r"nest deeper than 100 levels \(at parameters\.latencySLO"
    ):
        lease_of_claim(kube_json.loads(raw), DRIVER, "donor", "gpu-0-remote")


def test_the_scaler_posts_one_warning_event_on_a_cut_claim() -> None:
    posted: list[tuple[str, dict[str, Any]]] = []

    def record(involved: dict[str, Any], namespace: str, kind: str, reason: str, message: str):
        posted.append(
            (namespace, {"involved": involved, "kind": kind, "reason": reason, "message": message})
        )

    scaler = Scaler(kube(claim_list()), ScalerConfig(CFG))  # not started
    scaler._event = record  # type: ignore[method-assign]
    listed = claim_list(claim("good", GOOD), claim("bad", '{"a":' + nested(1000) + "}"))
    good, bad = kube(listed).get("/x")["items"]
    for change, obj in (("ADDED", good), ("ADDED", bad), ("MODIFIED", bad), ("DELETED", bad)):
        scaler._claim_seen(change, obj)
    [(ns, event)] = posted
    assert ns == "other" and event["involved"]["name"] == "bad"
    assert (event["kind"], event["reason"]) == ("Warning", names.NESTED_TOO_DEEP)
    assert ".spec.devices.config[0].opaque.parameters.a[0]" in event["message"]


# -- fuzz -------------------------------------------------------------------------------------

_shapes = st.text(alphabet="[{", min_size=1, max_size=8)


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, BODY_DEPTH_MAX), shape=_shapes)
@example(depth=BODY_DEPTH_MAX, shape="[")
@example(depth=kube_json.MAX_DEPTH, shape="{")
@example(depth=kube_json.MAX_DEPTH + 1, shape="[{")
def test_fuzz_any_depth_the_server_accepts_decodes(depth: int, shape: str) -> None:
    """Up to the API server's 10,000 levels: decoded, the same either way, cut exactly
    below MAX_DEPTH and nowhere else."""
    raw = nested(depth, shape)
    value, cut = kube_json.decode(raw)
    built, built_cut = kube_json._build(raw.encode())
    assert (value, cut) == (built, built_cut)
    assert cut == (depth > kube_json.MAX_DEPTH)
    if not cut:
        assert value == json.loads(raw)
        return
    node, levels = value, 0
    while node is not kube_json.TOO_DEEP:
        node = node["k"] if isinstance(node, dict) else node[0]
        levels += 1
    assert levels == kube_json.MAX_DEPTH


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=150, deadline=None)
@given(value=_json)
def test_fuzz_shallow_json_is_what_json_loads_gives(value: Any) -> None:
    raw = json.dumps(value)
    assert kube_json.decode(raw) == (json.loads(raw), False)
    assert kube_json._build(raw.encode()) == (json.loads(raw), False)


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(1, OPAQUE_MAX // 2),
    shape=_shapes,
    ours=st.booleans(),
    filler=st.integers(0, OPAQUE_MAX),
)
@example(depth=(OPAQUE_MAX - 7) // 2, shape="[", ours=True, filler=0)
def test_fuzz_claim_decoding(depth: int, shape: str, ours: bool, filler: int) -> None:
    """A claim with opaque parameters of up to 10 KiB, of any depth that fits, listed
    beside a good claim: both decode; the good one whole; the deep one is refused by our
    config parser and SLO reader with their typed errors, or read."""
    inner = nested(depth, shape)
    head = '{"apiVersion":"gpu.composable.dra.io/v1alpha1","kind":"GpuConfig",' if ours else "{"
    pad = max(0, min(filler, OPAQUE_MAX - len(head) - len(inner) - 20))
    parameters = head + '"env":{"A":"' + "x" * pad + '"},"deep":' + inner + "}"
    if len(parameters) > OPAQUE_MAX:
        parameters = '{"deep":' + nested((OPAQUE_MAX - 10) // 6, "{") + "}"
    assert len(parameters) <= OPAQUE_MAX
    body = kube(claim_list(claim("good", GOOD), claim("bad", parameters))).get("/x")
    good, bad = body["items"]
    assert good == json.loads(claim("good", GOOD))
    copy.deepcopy(freeze(bad))
    with contextlib.suppress(ConfigError):
        claim_configs(bad["status"]["allocation"]["devices"]["config"], DRIVER)
    with contextlib.suppress(ConfigError):
        lease_of_claim(bad, DRIVER, "donor", "gpu-0-remote")
    if not kube_json.cut_paths(bad):
        assert bad == json.loads(claim("bad", parameters))


def test_parse_parameters_names_where_it_was_cut() -> None:
    params = kube_json.loads('{"kind":"GpuConfig","env":%s}' % nested(200))  # noqa: UP031
    with pytest.raises(ConfigError, match=r"at parameters\.env\[0\]"):
        parse_parameters(params)


def test_not_json_is_a_value_error_at_any_depth() -> None:
    for bad in (b"[" * 3000 + b"x", b"[" * 3000, b"[" * 3000 + b"]" * 3000 + b"junk", b"{]"):
        with pytest.raises(ValueError):
            kube_json.loads(bad)
