"""Fuzzing the Fsas FM emulator's request parsing: a typed request or a 4xx, never a crash."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric_emulator.fsas import api
from fabric_emulator.fsas.config import FsasConfig, process_args
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import host_uuid

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
        assert cond.operator == "eq"


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
    work: Path = tmp_path_factory.mktemp("fsas-fuzz")
    with EmulatorProcess(extra_args=process_args(work, FsasConfig()), workdir=work) as e:
        yield e


@settings(max_examples=60)
@given(body=st.binary(max_size=200) | json_values.map(lambda v: repr(v).encode()))
def test_hostile_bodies_over_http_get_4xx(emu: EmulatorProcess, body: bytes) -> None:
    cfg = FsasConfig()
    token = requests.post(
        f"{emu.url}/id_manager/realms/{cfg.realm}/protocol/openid-connect/token",
        data={"client_id": cfg.client_id, "client_secret": cfg.client_secret,
              "grant_type": "client_credentials"},
        timeout=10,
    ).json()["access_token"]  # fmt: skip
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
