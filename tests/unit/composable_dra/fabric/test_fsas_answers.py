"""Fuzzing what the fsas-fm backend reads of the network (issue 25.8): whatever an answer
holds, a meaning or a typed FabricError, never another exception."""

from __future__ import annotations

import base64
import contextlib
import io
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from composable_dra.fabric import backend as b
from composable_dra.fabric import errors as fe
from composable_dra.fabric import fsas_answers as answers
from composable_dra.fabric.fsas import FsasCredentials, FsasFabricManagerBackend
from composable_dra.fabric.http_answer import parse_json

FUZZ = settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300, max_value=10**400)  # too large for a float
    | st.floats()  # NaN and infinities too: a caller may hand them in
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=15,
)
# Answers in the FM's shapes with any value anywhere, so that the fuzzer reaches the deep
# reads too (a list where an object goes, an id that is a number, ...).
either = json_values.__or__
resource = st.fixed_dictionaries(
    {},
    optional={
        "res_uuid": either(st.sampled_from(["gpu-1", "gpu-9", "../x"])),
        "res_type": either(st.just("gpu")),
        "res_op_status": either(st.sampled_from(["0", "2", "3"])),
        "res_serial_num": json_values,
        "res_spec": either(
            st.fixed_dictionaries(
                {
                    "condition": either(
                        st.lists(
                            json_values
                            | st.just({"column": "model", "operator": "eq", "value": "A100"}),
                            max_size=2,
                        )
                    )
                }
            )
        ),
        "mach_uuid": either(st.just("m-1")),
        "fabric_uuid": json_values,
    },
)
machine = st.fixed_dictionaries(
    {},
    optional={
        "mach_uuid": either(st.just("m-1")),
        "mach_name": json_values,
        "fabric_uuid": json_values,
        "fabric_id": json_values,
        "resources": either(st.lists(either(resource), max_size=3)),
    },
)
data = st.fixed_dictionaries(
    {},
    optional={
        "machines": either(st.lists(either(machine), max_size=3)),
        "resources": either(st.lists(either(resource), max_size=3)),
    },
)
bodies = either(
    st.fixed_dictionaries(
        {},
        optional={
            "data": either(data),
            "reserved_res_num_per_fabric": json_values,
            "detail": either(st.fixed_dictionaries({"code": json_values, "message": json_values})),
            "access_token": either(st.text(max_size=10)),
            "expires_in": json_values,
        },
    )
)  # fmt: skip


def jwt(claims: Any) -> str:
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"h.{payload}.s"


tokens = st.one_of(
    st.text(max_size=20),
    bodies.map(lambda c: jwt(c) if _dumpable(c) else "x"),
    st.binary(max_size=40).map(lambda raw: "h." + base64.urlsafe_b64encode(raw).decode() + ".s"),
)


def _dumpable(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=True)
    except (ValueError, TypeError):
        return False
    return True


def typed(fn: Any, *args: Any) -> None:
    """``fn(*args)``: a result or a typed fabric error, nothing else."""
    with contextlib.suppress(fe.FabricError):
        fn(*args)


@FUZZ
@given(bodies, st.floats(min_value=0, max_value=2e9))
def test_token_answers_give_a_token_or_an_auth_error(answer: Any, now: float) -> None:
    try:
        token, lifetime = answers.token_of(answer, now, "fm")
    except fe.AuthError:
        return
    assert token and "\n" not in token and lifetime <= answers.MAX_TOKEN_LIFETIME


@FUZZ
@given(tokens, st.one_of(st.none(), bodies))
def test_token_lifetimes_and_jwt_claims_give_a_time_or_an_auth_error(
    token: str, expires_in: Any
) -> None:
    answer = {"access_token": token, "expires_in": expires_in}
    try:
        expiry = answers.token_expiry(answer, 1000.0)
    except fe.AuthError:
        return
    assert expiry == expiry and abs(expiry) != float("inf")  # a finite time


def test_a_jwt_exp_is_read_when_no_lifetime_is_given() -> None:
    assert answers.token_expiry({"access_token": jwt({"exp": 4242})}, 0.0) == 4242.0
    for exp in (True, "4242", 10**400, None, [1]):
        with pytest.raises(fe.AuthError):
            answers.token_expiry({"access_token": jwt({"exp": exp})}, 0.0)


def test_a_claimed_lifetime_is_kept_at_most_a_day() -> None:
    token, lifetime = answers.token_of({"access_token": "t", "expires_in": 1e300}, 0.0, "fm")
    assert (token, lifetime) == ("t", answers.MAX_TOKEN_LIFETIME)


@FUZZ
@given(bodies, st.sampled_from(["machines", "resources"]))
def test_lists_are_read_or_refused(body: Any, key: str) -> None:
    try:
        found = answers.listed(body, key, "GET x")
    except fe.BadAnswerError:
        return
    assert all(isinstance(item, dict) for item in found)


@FUZZ
@given(bodies, bodies)
def test_machines_and_resources_read_as_devices_or_nothing(machine: Any, resource: Any) -> None:
    if isinstance(machine, dict):
        for d in answers.machine_devices(machine):
            assert isinstance(d, b.Device) and d.host == answers.machine_id(machine)
        answers.zone_id(machine)
    if isinstance(resource, dict):
        device = answers.device_of(resource, None, "z")
        assert device is None or device.state in ("free", "busy")


@FUZZ
@given(st.lists(machine, max_size=4), st.lists(resource, max_size=4))
def test_zones_hold_their_machines_and_gpus_and_nothing_else(
    machines: list[dict[str, Any]], resources: list[dict[str, Any]]
) -> None:
    attached = [d for m in machines for d in answers.machine_devices(m)]
    free = [d for r in resources if (d := answers.device_of(r, None, answers.zone_id(r)))]
    zones = answers.zones_of(machines, [*attached, *free])
    assert list(zones) == sorted(zones)
    assert {(z.id, h) for z in zones.values() for h in z.hosts} == {
        (answers.zone_id(m), answers.machine_id(m)) for m in machines
    }
    assert {(z.id, d) for z in zones.values() for d in z.devices} == {
        (d.zone, d.id) for d in [*attached, *free]
    }


def test_a_zone_may_have_only_machines_or_only_gpus() -> None:
    machines = [{"mach_uuid": "m-1", "fabric_uuid": "a"}, {"mach_uuid": "m-2", "fabric_uuid": "a"}]
    gpu = b.Device(id="gpu-1", model="A100", zone="b", uuid="", state="free")
    assert answers.zones_of(machines, [gpu]) == {
        "a": b.Zone("a", frozenset({"m-1", "m-2"}), frozenset()),
        "b": b.Zone("b", frozenset(), frozenset({"gpu-1"})),
    }


@FUZZ
@given(st.integers(min_value=100, max_value=599), bodies, st.text(max_size=30))
def test_failures_are_typed_errors(status: int, body: Any, retry_after: str) -> None:
    try:
        err = answers.error_for(status, body, {"retry-after": retry_after}, "op")
    except fe.BadAnswerError:
        return  # a wait of more than a day
    assert isinstance(err, fe.FabricError) and len(str(err)) < 1000


@FUZZ
@given(bodies)
def test_free_counts_are_counts_or_refused(body: Any) -> None:
    try:
        count = answers.free_count(body, "free")
    except fe.BadAnswerError:
        return
    assert isinstance(count, int) and count >= 0


@FUZZ
@given(st.binary(max_size=200) | bodies.filter(_dumpable).map(lambda v: json.dumps(v).encode()))
def test_answer_bytes_parse_or_are_a_bad_answer(raw: bytes) -> None:
    typed(parse_json, raw, "GET x")


def test_deep_and_non_finite_json_are_bad_answers() -> None:
    for raw in (b"[" * 100_000, b"[" * 65 + b"]" * 65, b"NaN", b"-Infinity", b"1e999"):
        with pytest.raises(fe.BadAnswerError):
            parse_json(raw, "GET x")
    assert parse_json(b"[" * 64 + b"]" * 64, "GET x") is not None


# -- the whole backend, every answer drawn ------------------------------------------------------


class Answer:
    def __init__(self, status: int, raw: bytes, retry_after: str) -> None:
        self.status_code = status
        self.raw = io.BytesIO(raw)
        self.headers = {"retry-after": retry_after}

    def close(self) -> None:
        pass


class DrawnFM:
    """A session whose every answer is drawn (one module's unit test: the answers the
    emulator never gives)."""

    verify: Any = True

    def __init__(self, drawn: list[tuple[int, bytes, str]]) -> None:
        self.drawn, self.calls = drawn, 0

    def request(self, method: str, url: str, **_: Any) -> Answer:
        status, raw, retry_after = self.drawn[self.calls % len(self.drawn)]
        self.calls += 1
        return Answer(status, raw, retry_after)

    def close(self) -> None:
        pass


TOKEN = json.dumps({"access_token": "t", "expires_in": 300}).encode()
statuses = st.sampled_from([200, 200, 200, 204, 301, 307, 400, 401, 404, 409, 429, 500, 503])
raws = (
    st.binary(max_size=60)
    | bodies.filter(_dumpable).map(lambda v: json.dumps(v).encode())
    | st.just(TOKEN)
)
drawn_answers = st.lists(
    st.tuples(statuses, raws, st.sampled_from(["", "2", "999999999", "soon"])),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(drawn_answers, st.booleans())
def test_every_backend_call_ends_in_a_result_or_a_typed_error(
    drawn: list[tuple[int, bytes, str]], by_model: bool
) -> None:
    backend = FsasFabricManagerBackend(
        "https://fm.example",
        FsasCredentials("c", "s", "u", "p"),
        tenant_uuid="t",
        realm="r",
        session=DrawnFM([(200, TOKEN, ""), *drawn]),  # type: ignore[arg-type]
        attach_by_model=by_model,
        models=("A100",),
    )
    typed(backend.hosts)
    typed(backend.inventory)
    typed(backend.device, "gpu-1")
    typed(backend.host_devices, "m-1")
    typed(backend.detach, "gpu-1", "m-1")
    if by_model:
        typed(backend.attach_model, "A100", "m-1")
    else:
        typed(backend.attach, "gpu-1", "m-1")
