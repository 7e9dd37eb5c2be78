"""The lending policy in the product: what the donor measures, the claim's latency SLO,
the donor status the plugin reads, and the taint and lease counter it publishes."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.lending import netaware
from composable_dra.lending.remote_leases import Code, LeaseAPIError, LendingStatus, parse_status
from composable_dra.model.gpu_config import ConfigError, parse_parameters
from dra_driver.lend_status import DonorStatusPoller, next_state
from dra_driver.slices import (
    LendPolicy,
    LendState,
    desired_slices,
    link_leases,
    plan_slices,
)
from remote_gpu import slo
from remote_gpu.claim_config import lease_of_claim
from remote_gpu.measure import LatencySamples, RateWindow, parse_model
from testbed import examples
from tests.unit.dra_driver.plugin_fixtures import DRIVER, NODE, gpu

FUZZ = settings(max_examples=150)
UID = "node-uid"
POLICY = LendPolicy(network_domain="rack-1", link_gbps=100, max_leases=3)
RULE = netaware.LinkBusyRule(busy_at=0.7, clear_at=0.5)


# -- what the donor measures ------------------------------------------------------------


def test_rate_window_counts_only_the_last_window() -> None:
    w = RateWindow(2.0)
    w.add(0.0, 1000)
    w.add(1.0, 3000)
    w.add(1.5, 0)  # nothing moved: no event
    assert w.rate(1.5) == 2000.0
    assert w.rate(2.5) == 1500.0  # the first report has left the window
    assert w.rate(3.0) == 0.0
    with pytest.raises(ValueError):
        RateWindow(0)


def test_latency_samples_fit_or_fall_back_to_the_prior() -> None:
    samples = LatencySamples(limit=4)
    prior = slo.LatencyModel(0.05, 0.05)
    assert samples.models({"f": prior}) == {"f": prior}
    for k, t in [(1, 0.010), (2, 0.020), (3, 0.030), (4, 0.040), (0, 9.0), (1, float("nan"))]:
        samples.add("g", k, t)
    assert samples.counts() == {"g": 4}  # bad samples are dropped
    g = samples.models({})["g"]
    assert g.latency(1) == pytest.approx(0.01) and g.growth_s == pytest.approx(0.01)
    # Only one concurrency measured: growth unknown, so never below the prior's.
    for _ in range(3):
        samples.add("f", 1, 0.02)
    f = samples.models({"f": prior})["f"]
    assert f.service_s == 0.05 and f.growth_s == 0.05
    samples.add("g", 1, 0.5)  # the oldest goes: at most ``limit`` kept
    assert len(samples.samples("g")) == 4 and samples.samples("g")[-1] == (1, 0.5)


def test_parse_model() -> None:
    assert parse_model("paced=0.05") == ("paced", slo.LatencyModel(0.05, 0.05))
    assert parse_model("m=0.01:0.002") == ("m", slo.LatencyModel(0.01, 0.002))
    for bad in ("paced", "=0.1", "m=x", "m=0", "m=-1", "m=0.1:-1", "m=inf", "m=0.1:nan"):
        with pytest.raises(ValueError, match="latency-model"):
            parse_model(bad)


# -- the claim's latency SLO ----------------------------------------------------------------


def slo_claim(
    parameters: Any = None, requests: Any = None, device: str = "gpu-0-remote"
) -> dict[str, Any]:
    config: list[Any] = []
    if parameters is not None:
        config.append(
            {
                "source": "FromClaim",
                "requests": ["gpu"] if requests is None else requests,
                "opaque": {"driver": DRIVER, "parameters": parameters},
            }
        )
    return {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": "donor", "device": device}
                    ],
                    "config": config,
                }
            }
        }
    }


def params(**latency: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu.composable.dra.io/v1alpha1", "kind": "GpuConfig", **latency}


def test_the_claims_slo_for_the_allocated_device() -> None:
    with_slo = slo_claim(params(latencySLO={"function": "matmul", "seconds": 0.05}))
    assert lease_of_claim(with_slo, DRIVER, "donor", "gpu-0-remote") == slo.Lease("matmul", 0.05)
    assert lease_of_claim(with_slo, DRIVER, "donor", "gpu-1-remote") is None  # not its device
    assert lease_of_claim(slo_claim(params()), DRIVER, "donor", "gpu-0-remote") == slo.Lease("")
    other_request = slo_claim(params(latencySLO={"function": "m", "seconds": 1}), ["other"])
    assert lease_of_claim(other_request, DRIVER, "donor", "gpu-0-remote") == slo.Lease("")
    # The class's config first, the claim's wins.
    both = slo_claim(params(latencySLO={"function": "m", "seconds": 1}))
    cfgs = both["status"]["allocation"]["devices"]["config"]
    cfgs.insert(0, {**copy.deepcopy(cfgs[0]), "source": "FromClass"})
    cfgs[0]["opaque"]["parameters"]["latencySLO"]["seconds"] = 9
    assert lease_of_claim(both, DRIVER, "donor", "gpu-0-remote") == slo.Lease("m", 1.0)
    for bad in (
        {"function": "m"},
        {"function": "../x", "seconds": 1},
        {"function": "m", "seconds": 0},
    ):
        with pytest.raises(ConfigError, match=r"invalid GpuConfig: latencySLO"):
            lease_of_claim(slo_claim(params(latencySLO=bad)), DRIVER, "donor", "gpu-0-remote")


def test_the_plugin_validates_the_slo_at_prepare_with_a_clear_error() -> None:
    cfg = parse_parameters(params(latencySLO={"function": "matmul", "seconds": 0.05}))
    assert cfg.latencySLO is not None and cfg.latencySLO.seconds == 0.05
    with pytest.raises(ConfigError, match=r"latencySLO\.seconds"):
        parse_parameters(params(latencySLO={"function": "matmul", "seconds": "soon"}))
    with pytest.raises(ConfigError, match=r"latencySLO\.extra"):
        parse_parameters(params(latencySLO={"function": "matmul", "seconds": 1, "extra": 1}))


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from(["request", "driver", "pool", "device", "requests", "opaque", "source"])


@FUZZ
@given(
    st.dictionaries(st.sampled_from(["function", "seconds", "x"]), JSONISH, max_size=3),
    JSONISH,
    st.dictionaries(KEYS, JSONISH, max_size=4),
)
def test_lease_of_claim_fuzz(latency: Any, requests: Any, result: Any) -> None:
    """Whatever the claim holds: an SLO lease, None, or ConfigError."""
    claim = slo_claim(params(latencySLO=latency), requests)
    claim["status"]["allocation"]["devices"]["results"].append(result)
    for c in (claim, {"status": {"allocation": {"devices": {"results": result}}}}, latency):
        try:
            found = lease_of_claim(c, DRIVER, "donor", "gpu-0-remote")
        except ConfigError:
            continue
        assert found is None or found.slo_s is None or 0 < found.slo_s <= 3600


# -- the donor's status, as the plugin reads it ----------------------------------------------


def status(load: float | None, capacity: int = 1024) -> LendingStatus:
    return LendingStatus(
        instance="i",
        leases=1,
        window_s=10.0,
        link_bytes_per_second=0.0 if load is None else load * 1000,
        link_capacity=None if load is None else 1000.0,
        link_load=load,
        lease_capacity=capacity,
    )


def test_next_state_applies_the_rule_with_hysteresis_and_caps_at_the_knee() -> None:
    state = LendState()
    seen = []
    for load in (0.6, 0.7, 0.55, 0.5, 0.69):
        state = next_state(state, status(load), RULE, knee=3)
        seen.append(state.busy)
    assert seen == [False, True, True, False, False]
    assert next_state(LendState(busy=True), None, RULE, 3) == LendState(busy=True)  # no answer
    assert next_state(LendState(busy=True), status(None), RULE, 3) == LendState()  # unmeasured
    assert next_state(LendState(), status(0.1, capacity=2), RULE, 3).leases == 2
    assert next_state(LendState(), status(0.1, capacity=3), RULE, 3).leases is None


class Client:
    """A lease client whose donor status answers are ``answers``, one a call."""

    def __init__(self, *answers: LendingStatus | LeaseAPIError) -> None:
        self.answers = list(answers)

    def status(self, donor: str) -> LendingStatus:
        answer = self.answers.pop(0)
        if isinstance(answer, LeaseAPIError):
            raise answer
        return answer


def test_the_poller_republishes_only_on_change_and_keeps_state_while_the_donor_is_down() -> None:
    client, published = Client(), list[LendState]()
    poller = DonorStatusPoller(client, NODE, published.append, RULE, 1.0, knee=3)  # type: ignore[arg-type]
    client.answers = [
        status(0.9),
        status(0.8),
        LeaseAPIError(Code.UNAVAILABLE, "down"),
        status(0.1, capacity=1),
    ]
    for _ in range(4):
        poller.poll_once()
    assert published == [LendState(busy=True), LendState(busy=False, leases=1)]


STATUS_KEYS = st.sampled_from(
    [
        "instance",
        "leases",
        "windowSeconds",
        "linkBytesPerSecond",
        "linkCapacityBytesPerSecond",
        "linkLoad",
        "leaseCapacity",
        "functions",
        "x",
    ]
)


@FUZZ
@given(st.dictionaries(STATUS_KEYS, JSONISH, max_size=9) | JSONISH)
def test_parse_status_fuzz(payload: Any) -> None:
    """A donor's answer: a status whose numbers make sense, or a typed error."""
    good = status(0.5).model_dump(by_alias=True)
    for candidate in (payload, {**good, **payload} if isinstance(payload, dict) else good):
        try:
            parsed = parse_status(json.loads(json.dumps(candidate, allow_nan=True)), "d")
        except LeaseAPIError as exc:
            assert exc.code is Code.INTERNAL
            continue
        assert parsed.lease_capacity >= 0 and parsed.window_s > 0
        assert parsed.link_load is None or 0 <= parsed.link_load <= 1


# -- the slices ------------------------------------------------------------------------------


def devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def link_counter(slices: list[dict[str, Any]]) -> str:
    for s in slices:
        for c in s["spec"].get("sharedCounters") or []:
            if c["name"] == "link":
                return str(c["counters"]["leases"]["value"])
    raise AssertionError("no link counter")


def test_a_busy_link_taints_the_remote_devices_only() -> None:
    calm = desired_slices(NODE, UID, DRIVER, [gpu(0), gpu(1)], 1, lend=POLICY)
    busy = desired_slices(
        NODE, UID, DRIVER, [gpu(0), gpu(1)], 1, lend=POLICY, state=LendState(True)
    )
    assert all("taints" not in d for d in devices(calm).values())
    taint = {"key": "composable.dra.io/link-busy", "value": "true", "effect": "NoSchedule"}
    for name, d in devices(busy).items():
        assert d.get("taints") == ([taint] if name.endswith("-remote") else None), name
    # The plan sees the difference, and the server's timeAdded is no difference.
    assert plan_slices(
        NODE, UID, DRIVER, [gpu(0), gpu(1)], calm, lend=POLICY, state=LendState(True)
    ).apply
    echoed = copy.deepcopy(busy)
    for d in devices(echoed).values():
        for t in d.get("taints") or []:
            t["timeAdded"] = "2026-11-23T18:00:00Z"
    plan = plan_slices(
        NODE, UID, DRIVER, [gpu(0), gpu(1)], echoed, lend=POLICY, state=LendState(True)
    )
    assert plan.empty


def test_the_link_counter_is_the_slo_capacity_under_the_knee() -> None:
    assert link_leases(POLICY, LendState()) == 3
    assert link_leases(POLICY, LendState(leases=1)) == 1
    assert link_leases(POLICY, LendState(leases=7)) == 3
    one = desired_slices(NODE, UID, DRIVER, [gpu(0)], 1, lend=POLICY, state=LendState(leases=1))
    assert link_counter(one) == "1"


def test_the_example_tolerates_the_taint_and_its_slo_parses() -> None:
    """deploy/examples/remote-insensitive-slo.yaml, as the e2e test applies it."""
    [template] = [o for o in examples.load("remote-insensitive-slo") if o["kind"] != "Pod"]
    spec = template["spec"]["spec"]["devices"]
    [request] = spec["requests"]
    assert request["exactly"]["tolerations"] == [netaware.INSENSITIVE_TOLERATION]
    [config] = spec["config"]
    assert parse_parameters(config["opaque"]["parameters"]).latencySLO is not None
