"""Fuzzing the Fsas FM emulator's request parsing: a typed request or a 4xx, never a crash."""

from __future__ import annotations

import http.client
import json
import select
import socket
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric_emulator.fsas import api
from fabric_emulator.fsas.config import FsasConfig
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import host_uuid
from tests.unit.conftest import fsas_emulator

TENANT, MACHINE = "t-1", "m-1"
FUZZ = settings(max_examples=200)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
# Bodies that are close to valid, so the fuzzer reaches the deep checks too.
keys = st.sampled_from(
    ["tenants", "tenant_uuid", "machines", "mach_uuid", "resources", "res_specs", "res_type",
     "res_spec", "condition", "column", "operator", "value", "res_num", "res_uuid"]
)  # fmt: skip
near_values = st.recursive(
    st.sampled_from([TENANT, MACHINE, "gpu", "model", "eq", "res_uuid", 1, 0, 129, None, True]),
    lambda inner: st.lists(inner, min_size=1, max_size=2) | st.dictionaries(keys, inner),
    max_leaves=20,
)


def _valid_or_4xx(parse: Any, body: Any) -> None:
    try:
        parse(body, TENANT, MACHINE)
    except api.FsasError as err:
        assert 400 <= err.status < 500
        assert err.body()["detail"]["code"]


@FUZZ
@given(st.one_of(json_values, near_values))
def test_update_bodies_parse_or_refuse(body: Any) -> None:
    _valid_or_4xx(api.parse_add, body)
    _valid_or_4xx(api.parse_remove, body)


@FUZZ
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_token_forms_parse_or_refuse(raw: bytes) -> None:
    try:
        req = api.parse_token_form(raw)
    except api.FsasError as err:
        assert err.status == 400
    else:
        assert req.grant_type in ("password", "client_credentials")
        assert req.client_id and req.client_secret


@FUZZ
@given(st.text(max_size=40) | st.none())
def test_condition_queries_parse_or_refuse(raw: str | None) -> None:
    try:
        cond = api.parse_condition_query(raw)
    except api.FsasError as err:
        assert err.status == 400
    else:
        sent = json.loads(raw or "")  # only eq is accepted
        assert sent["operator"] == "eq" and cond == api.Condition(sent["column"], sent["value"])


def test_a_condition_query_is_eq_only() -> None:
    cond = api.parse_condition_query('{"column": "model", "operator": "eq", "value": "A100"}')
    assert cond == api.Condition("model", "A100")
    with pytest.raises(api.FsasError) as err:
        api.parse_condition_query('{"column": "model", "operator": "ne", "value": "A100"}')
    assert err.value.status == 400 and "only eq" in err.value.message


def test_a_valid_attach_body_parses() -> None:
    body = {
        "tenants": {
            "tenant_uuid": TENANT,
            "machines": [
                {
                    "mach_uuid": MACHINE,
                    "resources": [
                        {
                            "res_specs": [
                                {
                                    "res_type": "gpu",
                                    "res_spec": {
                                        "condition": [
                                            {"column": "model", "operator": "eq", "value": "X"},
                                            {"column": "res_uuid", "operator": "eq", "value": "g"},
                                        ]
                                    },
                                    "res_num": 1,
                                }
                            ]
                        }
                    ],
                }
            ],
        }
    }
    spec = api.parse_add(body, TENANT, MACHINE)
    assert (spec.wanted("model"), spec.wanted("res_uuid"), spec.num) == ("X", "g", 1)
    with pytest.raises(api.FsasError) as other:
        api.parse_add(body, "another-tenant", MACHINE)
    assert other.value.status == 403


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    yield from fsas_emulator(tmp_path_factory, FsasConfig())


@settings(max_examples=60)
@given(body=st.binary(max_size=200) | json_values.map(lambda v: repr(v).encode()))
def test_hostile_bodies_over_http_get_4xx(emu: EmulatorProcess, body: bytes) -> None:
    cfg = FsasConfig()
    token = _token(emu)
    for method in ("PATCH", "DELETE"):
        resp = requests.request(
            method,
            f"{emu.url}/fabric_manager/api/v1/machines/{host_uuid('node-1')}/update",
            params={"tenant_uuid": cfg.tenant},
            data=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout=10,
        )
        assert 400 <= resp.status_code < 500, resp.text
        assert resp.json()["detail"]["code"]
    forged = requests.post(
        f"{emu.url}/id_manager/realms/{cfg.realm}/protocol/openid-connect/token",
        data=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=10,
    )
    assert forged.status_code in (400, 401), forged.text


def test_a_deeply_nested_condition_query_is_refused() -> None:
    """json.loads raised RecursionError on it: the emulator answered 500."""
    for deep in ("[" * 5000 + "]" * 5000, '{"a":' * 40 + "1" + "}" * 40):
        with pytest.raises(api.FsasError) as err:
            api.parse_condition_query(deep)
        assert err.value.status == 400


def _token(emu: EmulatorProcess) -> str:
    cfg = FsasConfig()
    answer = requests.post(
        f"{emu.url}/id_manager/realms/{cfg.realm}/protocol/openid-connect/token",
        data={"client_id": cfg.client_id, "client_secret": cfg.client_secret,
              "grant_type": "client_credentials"},
        timeout=10,
    )  # fmt: skip
    token: str = answer.json()["access_token"]
    return token


def test_a_deeply_nested_condition_query_over_http_gets_400(emu: EmulatorProcess) -> None:
    # Percent-encoded, within the request line's limit (8190 bytes), past json's recursion.
    deep = "[" * 1300 + "]" * 1300
    resp = requests.get(
        f"{emu.url}/fabric_manager/api/v1/machines/{host_uuid('node-1')}"
        f"/available-reserved-resources?tenant_uuid={FsasConfig().tenant}&condition={deep}",
        headers={"Authorization": f"Bearer {_token(emu)}"},
        timeout=10,
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["detail"]["code"] == "E_INVALID_PARAMETER"


def _split_exchange(url: str, head: str, body: bytes) -> tuple[int, bytes]:
    """One request whose body goes in two TCP segments, and the answer's status and body."""
    address = urllib.parse.urlsplit(url)
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lines = f"{head}\r\nHost: {address.netloc}\r\nContent-Length: {len(body)}\r\n"
        half = len(body) // 2
        sock.sendall(lines.encode() + b"Connection: close\r\n\r\n" + body[:half])
        # A server that answers before the whole body has come (as this one did) answers
        # now; a correct one waits for the rest. The bound gives the first its chance.
        early, _, _ = select.select([sock], [], [], 1.0)
        if not early:
            sock.sendall(body[half:])
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        return resp.status, resp.read()


def test_an_attach_body_split_over_two_segments_is_read_whole(emu: EmulatorProcess) -> None:
    emu.reset()
    cfg, machine = FsasConfig(), host_uuid("node-1")
    spec = {
        "res_type": "gpu",
        "res_num": 1,
        "res_spec": {
            "condition": [{"column": "model", "operator": "eq", "value": "NVIDIA H100 80GB HBM3"}]
        },
    }
    body = {"tenants": {"tenant_uuid": cfg.tenant, "machines": [
        {"mach_uuid": machine, "resources": [{"res_specs": [spec]}]}]}}  # fmt: skip
    status, answer = _split_exchange(
        emu.url,
        f"PATCH /fabric_manager/api/v1/machines/{machine}/update?tenant_uuid={cfg.tenant}"
        f" HTTP/1.1\r\nAuthorization: Bearer {_token(emu)}\r\nContent-Type: application/json",
        json.dumps(body).encode(),
    )
    assert status == 200, answer
    assert len(json.loads(answer)["data"]["machines"][0]["resources"]) == 1
    emu.reset()


def test_a_token_form_split_over_two_segments_is_read_whole(emu: EmulatorProcess) -> None:
    cfg = FsasConfig()
    form = urllib.parse.urlencode(
        {"client_id": cfg.client_id, "client_secret": cfg.client_secret,
         "grant_type": "client_credentials"}
    ).encode()  # fmt: skip
    status, answer = _split_exchange(
        emu.url,
        f"POST /id_manager/realms/{cfg.realm}/protocol/openid-connect/token HTTP/1.1\r\n"
        "Content-Type: application/x-www-form-urlencoded",
        form,
    )
    assert status == 200, answer
    assert json.loads(answer)["access_token"]
