"""testbed.suite_setup: the objects and flags a suite starts with, from its options."""

from __future__ import annotations

import base64

from fabric_emulator.fsas.config import FsasConfig
from fabric_emulator.testing import EmulatorProcess
from testbed import suite_setup
from testbed.suite_options import SuiteOptions


def test_operator_elects_a_leader_only_when_asked() -> None:
    alone = suite_setup.operator_args(SuiteOptions(operator_args=["--x"]), "kc", "ns")
    assert alone == ["--kubeconfig=kc", "--metrics-port=0", "--x", "--no-leader-elect"]
    elected = suite_setup.operator_args(SuiteOptions(leader_elect_operator=True), "kc", "ns")
    assert elected[-1] == "--leader-elect-namespace=ns"


def test_the_scaler_and_publisher_elect_in_the_suites_namespace() -> None:
    opts = SuiteOptions(lease_duration=4, scaler_args=["--s"], publisher_args=["--p"])
    scaler = suite_setup.scaler_args(opts, "kc", "ns")
    publisher = suite_setup.publisher_args(opts, "kc", "ns")
    election = [
        "--leader-elect-namespace=ns",
        "--leader-elect-lease-duration=4",
        "--leader-elect-renew-deadline=3",
        "--leader-elect-retry-period=1",
    ]
    assert publisher == ["--kubeconfig=kc", *election, "--p"]
    assert scaler[: len(election) + 1] == ["--kubeconfig=kc", *election]
    assert scaler[-1] == "--s"


def test_backend_is_redfish_unless_the_suite_speaks_fsas() -> None:
    assert suite_setup.backend(SuiteOptions()) == {"backend": "redfish-composition"}
    fsas = FsasConfig(tenant="t", realm="r", attach_by_model=True)
    got = suite_setup.backend(SuiteOptions(fsas=fsas))
    assert got["backend"] == "fsas-fm"
    assert got["fsas"]["tenantUUID"] == "t" and got["fsas"]["realm"] == "r"
    assert got["fsas"]["attachBy"] == "model" and got["fsas"]["models"]


def test_credentials_carry_the_fsas_client_only_with_fsas() -> None:
    emulator = EmulatorProcess(user="u", password="p")
    plain = suite_setup.credentials_secret(SuiteOptions(), emulator)
    assert sorted(plain["data"]) == ["password", "username"]
    assert base64.b64decode(plain["data"]["username"]) == b"u"
    fsas = FsasConfig(client_id="c", client_secret="s")
    both = suite_setup.credentials_secret(SuiteOptions(fsas=fsas), emulator)
    assert base64.b64decode(both["data"]["client_secret"]) == b"s"
