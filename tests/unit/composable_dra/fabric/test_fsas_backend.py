"""The fsas-fm backend against the emulator's Fsas fabric manager API (a real HTTP server)."""

from __future__ import annotations

import base64
import io
import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from api.v1alpha1 import FabricSpec
from composable_dra.fabric import errors as fe
from composable_dra.fabric.fsas import TOKEN_LEEWAY_S, FsasCredentials, FsasFabricManagerBackend
from composable_dra.fabric.fsas_answers import token_expiry
from composable_dra.fabric.registry import FACTORIES, FabricConfigError, SecretKeys
from fabric_emulator.fsas.config import FsasConfig, process_args
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import gpu_uuid, host_uuid
from tests.unit.conftest import fsas_emulator

CONFIG = FsasConfig(tenant="tenant-7", realm="lab", client_id="cdra", client_secret="s3cr3t-x")
CREDS = FsasCredentials("cdra", "s3cr3t-x", "admin", "admin")
N1, N2, N3 = (host_uuid(f"node-{i}") for i in (1, 2, 3))


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    yield from fsas_emulator(tmp_path_factory, CONFIG)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fabric(emu: EmulatorProcess, clock: Clock) -> Iterator[FsasFabricManagerBackend]:
    emu.reset()
    backend = FsasFabricManagerBackend(
        emu.url, CREDS, tenant_uuid=CONFIG.tenant, realm=CONFIG.realm, clock=clock
    )
    yield backend
    backend.close()


def test_inventory_attach_detach(fabric: FsasFabricManagerBackend, emu: EmulatorProcess) -> None:
    inv = fabric.inventory()
    assert set(inv.hosts) == {N1, N2, N3}
    assert inv.hosts[N1].name == "node-1"
    gpu1 = inv.devices["gpu-1"]
    assert (gpu1.state, gpu1.zone, gpu1.model) == ("free", "zone-1", "NVIDIA H100 80GB HBM3")
    assert gpu1.uuid == gpu_uuid("gpu-1")
    assert inv.zones["zone-1"].hosts == {N1, N2}
    assert "gpu-1" in inv.zones["zone-1"].devices

    assert fabric.attach("gpu-1", N1) is None  # the FM answers synchronously
    after = fabric.device("gpu-1")
    assert after is not None and (after.state, after.host) == ("attached", N1)
    # The same composition as the Redfish view (what the node's plugin reads).
    assert emu.state()["blocks"]["gpu-1"] == {
        **emu.state()["blocks"]["gpu-1"],
        "state": "Composed",
    }
    assert emu.state()["blocks"]["gpu-1"]["system"] == "node-1"
    with pytest.raises(fe.InUseError):
        fabric.attach("gpu-1", N2)
    assert fabric.detach("gpu-1", N1) is None
    gone = fabric.device("gpu-1")
    assert gone is not None and gone.state == "free" and gone.host is None
    assert emu.state()["blocks"]["gpu-1"]["state"] == "Unused"


def test_unknown_and_bad_ids(fabric: FsasFabricManagerBackend) -> None:
    assert fabric.device("gpu-99") is None
    with pytest.raises(fe.NotFoundError):
        fabric.attach("gpu-99", N1)
    for bad in ("../machines", "a/b", "gpu-1?x=1", ".."):
        with pytest.raises(fe.FabricError):
            fabric.device(bad)
        with pytest.raises(fe.FabricError):
            fabric.detach("gpu-1", bad)


def test_unreachable_and_not_attached(fabric: FsasFabricManagerBackend) -> None:
    with pytest.raises(fe.OperationFailedError, match="E_INCOMPATIBLE"):
        fabric.attach("gpu-6", N1)  # zone-2 does not reach node-1
    with pytest.raises(fe.NotFoundError):
        fabric.detach("gpu-2", N1)  # not attached anywhere


@pytest.mark.parametrize(
    ("kind", "error", "applied"),
    [
        ("status503", fe.BusyError, False),
        ("status500", fe.TransientError, False),
        ("conflict409", fe.InUseError, False),
        ("drop_before", fe.TransientError, False),
        ("drop_after", fe.TransientError, True),
        ("task_failure", fe.OperationFailedError, False),
    ],
)
def test_faults_on_attach(
    fabric: FsasFabricManagerBackend,
    emu: EmulatorProcess,
    kind: str,
    error: type[fe.FabricError],
    applied: bool,
) -> None:
    emu.add_fault({"kind": kind, "path": "/update$", "method": "PATCH", "count": 1})
    with pytest.raises(error) as caught:
        fabric.attach("gpu-2", N1)
    if kind == "status503":
        assert caught.value.retry_after == 1
    device = fabric.device("gpu-2")  # a re-read tells what happened
    assert device is not None
    assert device.state == ("attached" if applied else "free")


def test_token_cached_until_it_nears_expiry(fabric: FsasFabricManagerBackend, clock: Clock) -> None:
    fabric.hosts()
    fabric.inventory()
    assert fabric.token_fetches == 1
    clock.now += CONFIG.token_seconds - TOKEN_LEEWAY_S - 1
    fabric.hosts()
    assert fabric.token_fetches == 1
    clock.now += 2  # within the leeway: renewed before the FM would refuse it
    fabric.hosts()
    assert fabric.token_fetches == 2


def test_refused_token_is_renewed_once(
    fabric: FsasFabricManagerBackend, emu: EmulatorProcess
) -> None:
    fabric.hosts()
    emu.admin("DELETE", "fsas/tokens")  # the FM forgets every token (restart, revocation)
    assert fabric.attach("gpu-3", N1) is None
    assert fabric.token_fetches == 2
    device = fabric.device("gpu-3")
    assert device is not None and device.state == "attached"


def test_bad_client_secret_is_an_auth_error_without_the_secret(emu: EmulatorProcess) -> None:
    wrong = FsasCredentials("cdra", "not-the-secret-42", "admin", "admin")
    backend = FsasFabricManagerBackend(emu.url, wrong, tenant_uuid=CONFIG.tenant, realm="lab")
    with pytest.raises(fe.AuthError) as refused:
        backend.hosts()
    assert "not-the-secret-42" not in str(refused.value)
    shown = repr(FsasCredentials("cdra", "client-secret-7", "admin", "password-7"))
    assert "cdra" in shown and "secret-7" not in shown and "password-7" not in shown
    assert "not-the-secret-42" not in repr(wrong)
    assert not refused.value.retryable


def test_other_tenant_is_refused(emu: EmulatorProcess) -> None:
    backend = FsasFabricManagerBackend(emu.url, CREDS, tenant_uuid="someone-else", realm="lab")
    with pytest.raises(fe.AuthError):
        backend.hosts()


def test_token_expiry_from_expires_in_or_the_jwt() -> None:
    assert token_expiry({"expires_in": 60}, 100.0) == 160.0
    claims = json.dumps({"exp": 4242}).encode()
    payload = base64.urlsafe_b64encode(claims).decode().rstrip("=")
    assert token_expiry({"access_token": f"h.{payload}.s"}, 0.0) == 4242.0
    with pytest.raises(fe.AuthError):
        token_expiry({"access_token": "opaque"}, 0.0)


def _raw(emu: EmulatorProcess, method: str, path: str, **kw: Any) -> requests.Response:
    token = requests.post(
        f"{emu.url}/id_manager/realms/lab/protocol/openid-connect/token",
        data={
            "client_id": "cdra",
            "client_secret": "s3cr3t-x",
            "username": "admin",
            "password": "admin",
            "grant_type": "password",
            "scope": "openid",
        },
        timeout=10,
    ).json()["access_token"]
    return requests.request(
        method,
        f"{emu.url}/fabric_manager/api/v1/{path}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
        **kw,
    )


def test_cohdi_shaped_requests(emu: EmulatorProcess, tmp_path: Path) -> None:
    """What CoHDI's clients send (model-only scale-up, counts) works as they expect."""
    emu.reset()
    cond = json.dumps({"column": "model", "operator": "eq", "value": "NVIDIA L40S"})
    query = urllib.parse.urlencode(
        {"tenant_uuid": "tenant-7", "res_type": "gpu", "condition": cond}
    )
    avail = _raw(emu, "GET", f"machines/{N3}/available-reserved-resources?{query}").json()
    assert avail["reserved_res_num_per_fabric"] == 2  # gpu-7, gpu-8 in node-3's fabric
    body = {
        "tenants": {
            "tenant_uuid": "tenant-7",
            "machines": [
                {
                    "mach_uuid": N3,
                    "resources": [
                        {
                            "res_specs": [
                                {
                                    "res_type": "gpu",
                                    "res_spec": {
                                        "condition": [
                                            {
                                                "column": "model",
                                                "operator": "eq",
                                                "value": "NVIDIA L40S",
                                            }
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
    up = _raw(emu, "PATCH", f"machines/{N3}/update?tenant_uuid=tenant-7", json=body)
    assert up.status_code == 200
    added = up.json()["data"]["machines"][0]["resources"]
    assert len(added) == 1 and added[0]["res_op_status"] == "0"
    machine = _raw(emu, "GET", f"machines/{N3}?tenant_uuid=tenant-7").json()
    assert [r["res_uuid"] for r in machine["data"]["machines"][0]["resources"]] == [
        added[0]["res_uuid"]
    ]
    bad = _raw(emu, "PATCH", f"machines/{N3}/update?tenant_uuid=tenant-7", json={"tenants": 1})
    assert bad.status_code == 400
    assert bad.json()["detail"]["code"] == "E_INVALID_PARAMETER"


class FakeResponse:
    """What the backend reads of a streamed requests.Response."""

    def __init__(self, status: int, body: Any) -> None:
        self.status_code = status
        self.raw = io.BytesIO(json.dumps(body).encode())  # read1, as urllib3's answer has
        self.headers: dict[str, str] = {}

    def close(self) -> None:
        pass


class StrangerFM:
    """An FM that ignores the res_uuid condition and attaches another GPU (one module's
    unit test: the guard cannot be reached through the emulator, which honours it)."""

    verify: Any = True

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, url: str, **kw: Any) -> FakeResponse:
        if "/id_manager/" in url:
            return FakeResponse(200, {"access_token": "t", "expires_in": 300})
        self.calls.append((method, url.rsplit("/api/v1/", 1)[-1], kw.get("json")))
        gpu = {"res_uuid": "gpu-1", "res_type": "gpu", "res_op_status": "0", "res_spec": {}}
        if method == "GET":
            return FakeResponse(200, {"data": {"resources": [gpu]}})
        if method == "PATCH":
            other = {**gpu, "res_uuid": "gpu-9"}
            return FakeResponse(200, {"data": {"machines": [{"resources": [other]}]}})
        return FakeResponse(200, {})

    def close(self) -> None:
        pass


def test_an_fm_that_attaches_another_gpu_gets_it_back_and_the_attach_fails() -> None:
    fm = StrangerFM()
    backend = FsasFabricManagerBackend(
        "https://fm.example",
        CREDS,
        tenant_uuid="t",
        realm="r",
        session=fm,  # type: ignore[arg-type]
    )
    with pytest.raises(fe.OperationFailedError, match="gpu-9"):
        backend.attach("gpu-1", "m-1")
    deletes = [c for c in fm.calls if c[0] == "DELETE"]
    assert len(deletes) == 1 and deletes[0][1] == "machines/m-1/update"
    spec = deletes[0][2]["tenants"]["machines"][0]["resources"][0]["res_specs"][0]
    assert spec == {"res_type": "gpu", "res_uuid": "gpu-9", "res_num": 1}


def _like_cohdi_mock(work: Path, **fsas: bool) -> EmulatorProcess:
    config = FsasConfig(CONFIG.tenant, CONFIG.realm, CONFIG.client_id, CONFIG.client_secret, **fsas)
    return EmulatorProcess(extra_args=process_args(work, config), workdir=work)


def test_an_fm_that_picks_by_model_as_cohdis_mock_does_attaches_only_its_own_pick(
    tmp_path: Path,
) -> None:
    """CoHDI's CI mock of the FM (cohdi-ci-mock app.py) reads only the model condition and
    attaches the first free GPU of that model: the emulator does the same when told. An
    attach of another GPU fails, naming the one the FM chose, and leaves nothing attached."""
    with _like_cohdi_mock(tmp_path, attach_by_model=True) as emu:
        backend = FsasFabricManagerBackend(
            emu.url, CREDS, tenant_uuid=CONFIG.tenant, realm=CONFIG.realm
        )
        try:
            # node-1's free H100s are gpu-1..gpu-4; the FM picks gpu-1.
            with pytest.raises(fe.OperationFailedError, match="gpu-1"):
                backend.attach("gpu-2", N1)
            blocks = emu.state()["blocks"]
            assert not [bid for bid, blk in blocks.items() if blk.get("system")]
            picked, named = backend.device("gpu-1"), backend.device("gpu-2")
            assert picked is not None and picked.state == "free"
            assert named is not None and named.state == "free"
            # The FM's own pick attaches; then gpu-2 is the first free one, and attaches.
            assert backend.attach("gpu-1", N1) is None
            assert backend.attach("gpu-2", N1) is None
            assert {bid for bid, blk in emu.state()["blocks"].items() if blk.get("system")} == {
                "gpu-1",
                "gpu-2",
            }
        finally:
            backend.close()


def test_an_fm_without_a_resource_list_fails_the_inventory_saying_so(tmp_path: Path) -> None:
    with _like_cohdi_mock(tmp_path, list_resources=False) as emu:
        backend = FsasFabricManagerBackend(
            emu.url, CREDS, tenant_uuid=CONFIG.tenant, realm=CONFIG.realm
        )
        try:
            assert set(backend.hosts()) == {N1, N2, N3}  # machines are served
            with pytest.raises(fe.FabricError, match="does not list its GPUs by identity") as err:
                backend.inventory()
            assert CREDS.client_secret not in str(err.value)
        finally:
            backend.close()


def test_registry_builds_the_backend_from_the_fabric_and_its_secret() -> None:
    def secret(**keys: str) -> SecretKeys:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()}
        return SecretKeys({"metadata": {"namespace": "ns", "name": "s"}, "data": data})

    spec = FabricSpec.model_validate(
        {
            "backend": "fsas-fm",
            "endpoint": "https://fm.example",
            "fsas": {"tenantUUID": "t-1", "realm": "cdi"},
            "credentialsSecret": {"namespace": "ns", "name": "s"},
        }
    )
    backend = FACTORIES["fsas-fm"](spec, secret(client_id="c", client_secret="x"), None)
    assert isinstance(backend, FsasFabricManagerBackend) and backend.tenant == "t-1"
    with pytest.raises(FabricConfigError, match="client_secret"):
        FACTORIES["fsas-fm"](spec, secret(client_id="c"), None)
    bare = spec.model_copy(update={"fsas": None})
    with pytest.raises(FabricConfigError, match=r"spec\.fsas"):
        FACTORIES["fsas-fm"](bare, secret(client_id="c", client_secret="x"), None)
    assert "x" not in repr(secret(client_id="c", client_secret="x"))


def test_a_block_status_set_in_the_emulator_is_the_fsas_device_fault(
    fabric: FsasFabricManagerBackend, emu: EmulatorProcess
) -> None:
    from composable_dra.model.health import Reason

    emu.set_block_status("gpu-1", health="Warning")
    warn = fabric.inventory().devices["gpu-1"]
    assert (warn.fault, warn.state) == (Reason.FABRIC_WARNING, "free")  # still usable
    assert fabric.attach("gpu-2", N1) is None
    emu.set_block_status("gpu-2", health="Critical")
    crit = fabric.inventory().devices["gpu-2"]  # read through its machine
    assert crit.fault is Reason.FABRIC_CRITICAL
    emu.set_block_status("gpu-1")
    assert fabric.inventory().devices["gpu-1"].fault is None
