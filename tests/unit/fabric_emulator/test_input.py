"""Hostile requests to the emulator over real HTTP: a 4xx with a Redfish error body, never 5xx."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric_emulator import limits, main
from fabric_emulator.testing import EmulatorProcess

from .conftest import BLOCKS, ROOT, message_ids

ATTACH = f"{ROOT}/Systems/node-1/Actions/ComputerSystem.AddResourceBlock"
JSON_HEADERS = {"Content-Type": "application/json"}


def post(emu: EmulatorProcess, path: str, data: bytes, **headers: Any) -> requests.Response:
    return requests.post(
        emu.url + path, data=data, headers=headers, auth=("admin", "admin"), timeout=30
    )


def admin(emu: EmulatorProcess, method: str, path: str, data: bytes, **headers: Any) -> Any:
    headers.setdefault("Authorization", f"Bearer {emu.admin_token}")
    return requests.request(
        method, f"{emu.url}/admin/{path}", data=data, headers=headers, timeout=30
    )


def test_credentials_that_are_not_utf8_are_refused_not_crashed(emu: EmulatorProcess) -> None:
    for headers in (
        {"X-Auth-Token": b"\xff\xfe\x80"},
        {"Authorization": b"Basic \xff\xfe"},
        {"Authorization": b"Basic " + b"\xe9:\xe9"},
    ):
        resp = requests.get(f"{emu.url}{ROOT}/Systems", headers=headers, timeout=10)
        assert resp.status_code == 401, (headers, resp.text)
        assert message_ids(resp) == ["Base.1.19.NoValidSession"]
    refused = requests.get(
        f"{emu.url}/admin/state", headers={"Authorization": b"Bearer \xff"}, timeout=10
    )
    assert refused.status_code == 401
    # A password with a lone surrogate (legal in JSON text) is a wrong password.
    login = post(
        emu,
        f"{ROOT}/SessionService/Sessions",
        b'{"UserName": "admin", "Password": "\\ud800"}',
        **JSON_HEADERS,
    )
    assert login.status_code == 401 and message_ids(login) == ["Base.1.19.NoValidSession"]


def test_a_body_over_the_limit_is_413(emu: EmulatorProcess) -> None:
    big = b'{"ResourceBlock": "' + b"x" * limits.MAX_BODY + b'"}'
    resp = post(emu, ATTACH, big, **JSON_HEADERS)
    assert resp.status_code == 413 and message_ids(resp) == ["Base.1.19.PayloadTooLarge"]
    assert admin(emu, "POST", "faults", big, **JSON_HEADERS).status_code == 413


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000,
        b'{"ResourceBlock": ' * 40 + b"{}" + b"}" * 40,
        b'{"ResourceBlock": NaN}',
        b'{"ResourceBlock": -Infinity}',
        b'{"ResourceBlock": ' + b"9" * 5000 + b"}",
        b"\xff\xfe{}",
    ],
    ids=["deep-unclosed", "deep-41", "nan", "infinity", "long-int", "not-utf8"],
)
def test_malformed_bodies_are_400(emu: EmulatorProcess, body: bytes) -> None:
    resp = post(emu, ATTACH, body, **JSON_HEADERS)
    assert resp.status_code == 400, resp.text
    assert message_ids(resp) == ["Base.1.19.MalformedJSON"]
    assert admin(emu, "PATCH", "config", body, **JSON_HEADERS).status_code == 400


def test_bodies_must_be_json(emu: EmulatorProcess) -> None:
    body = json.dumps({"ResourceBlock": {"@odata.id": f"{BLOCKS}/gpu-1"}}).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": ctype} if ctype else {}
        resp = post(emu, ATTACH, body, **headers)
        assert resp.status_code == 415, (ctype, resp.text)
        assert message_ids(resp) == ["Base.1.19.HeaderInvalid"]
        assert admin(emu, "PATCH", "config", b"{}", **headers).status_code == 415
    assert emu.state()["blocks"]["gpu-1"]["system"] is None
    ok = post(emu, ATTACH, body, **{"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_settings_are_bounded(emu: EmulatorProcess) -> None:
    for key, top in limits.SETTING_MAX.items():
        too_big = admin(emu, "PATCH", "config", json.dumps({key: top + 1}).encode(), **JSON_HEADERS)
        assert too_big.status_code == 400 and "at most" in too_big.json()["error"]
    assert emu.admin("GET", "config")["task_seconds"] == 10
    assert emu.admin("PATCH", "config", {"task_seconds": 3600})["task_seconds"] == 3600
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    assert parser.parse_args(["--task-seconds", "3600"]).task_seconds == 3600
    for flag in ("--task-seconds", "--retry-after", "--async-polls"):
        with pytest.raises(SystemExit):
            parser.parse_args([flag, "1000000"])


# ---- fuzz: arbitrary bodies, bounded ------------------------------------------------------

_json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=15), inner, max_size=3)
    ),
    max_leaves=15,
)
_bodies = st.one_of(
    st.binary(max_size=200),
    _json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {},
        optional={
            "ResourceBlock": st.one_of(
                _json_values, st.fixed_dictionaries({"@odata.id": st.text(max_size=60)})
            ),
            "ComputerSystemETag": _json_values,
            "Links": _json_values,
            "UserName": _json_values,
            "Password": _json_values,
        },
    ).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
)
_targets = st.sampled_from(
    [
        ("POST", ATTACH),
        ("POST", f"{ROOT}/Systems/node-1/Actions/ComputerSystem.RemoveResourceBlock"),
        ("PATCH", f"{ROOT}/Systems/node-2"),
        ("POST", f"{ROOT}/SessionService/Sessions"),
        ("POST", f"{ROOT}/Systems"),
    ]
)
_ctypes = st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain"])


@settings(max_examples=300)
@given(target=_targets, body=_bodies, ctype=_ctypes)
def test_fuzz_redfish_bodies(
    emulator: EmulatorProcess, target: tuple[str, str], body: bytes, ctype: str
) -> None:
    method, path = target
    resp = requests.request(
        method,
        emulator.url + path,
        data=body,
        headers={"Content-Type": ctype},
        auth=("admin", "admin"),
        timeout=30,
    )
    assert resp.status_code < 500, (resp.status_code, resp.text)
    if ctype == "text/plain" and body and resp.status_code not in (401, 405):
        assert resp.status_code == 415
    if resp.status_code >= 400:
        info = resp.json()["error"]["@Message.ExtendedInfo"]
        assert info and all(m["MessageId"].startswith(("Base.", "Composition.")) for m in info)


@settings(max_examples=150)
@given(
    target=st.sampled_from(
        [("PATCH", "config"), ("POST", "faults"), ("PUT", "faults"), ("PUT", "blocks/gpu-1/status")]
    ),
    body=_bodies,
)
def test_fuzz_admin_bodies(emulator: EmulatorProcess, target: tuple[str, str], body: bytes) -> None:
    method, path = target
    try:
        resp = admin(emulator, method, path, body, **JSON_HEADERS)
        assert resp.status_code < 500, (resp.status_code, resp.text)
        if resp.status_code >= 400:
            assert resp.json()["error"]
    finally:
        emulator.reset()  # a fault rule the fuzzer made must not touch other tests


def test_block_status_is_set_checked_and_cleared(emu: EmulatorProcess) -> None:
    def put(block: str, body: bytes) -> Any:
        return admin(emu, "PUT", f"blocks/{block}/status", body, **JSON_HEADERS)

    assert put("gpu-1", b'{"Health": "Critical"}').status_code == 200
    (block,) = [b for b in emu.state()["blocks"].items() if b[0] == "gpu-1"]
    assert block[1]["status"] == {"State": "Enabled", "Health": "Critical"}
    for bad in (b'{"Health": "Bad"}', b'{"State": 1}', b"{}", b"[]", b'{"Other": "x"}'):
        resp = put("gpu-1", bad)
        assert resp.status_code == 400 and resp.json()["error"], bad
    assert put("no-such-block", b'{"Health": "OK"}').status_code == 404
    assert admin(emu, "DELETE", "blocks/gpu-1/status", b"").status_code == 200
    assert emu.state()["blocks"]["gpu-1"]["status"] == {"State": "Enabled", "Health": "OK"}
