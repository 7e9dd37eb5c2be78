"""Every suite's plugins release GPUs on the emulator's host state (issue 29): the redfish
source and the fake NVML alike, but for the hosts that skip it on purpose."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from testbed import fake_nvml
from testbed.suite_nodes import NodeSettings, SuiteNodes


def nodes(tmp_path: Path, **settings: Any) -> SuiteNodes:
    emulator = SimpleNamespace(
        host_state_dir=tmp_path / "hosts", url="http://127.0.0.1:1", user="u", password="p"
    )
    base = NodeSettings(None, tmp_path / "kubeconfig", tmp_path, "x", 0.5, **settings)  # type: ignore[arg-type]
    return SuiteNodes(base, emulator)  # type: ignore[arg-type]


def test_redfish_plugins_run_the_release_command_on_the_host_state(tmp_path: Path) -> None:
    args, env = nodes(tmp_path).plugin_setup("node-1", tmp_path / "n1")
    assert "--device-source=redfish" in args
    assert [a for a in args if a.startswith("--host-release-command=")] == fake_nvml.release_args()
    assert env[fake_nvml.ROOT_ENV] == str(tmp_path / "hosts")
    assert env[fake_nvml.HOST_ENV] == "node-1"
    assert fake_nvml.PYTHONPATH not in env["PYTHONPATH"]  # the real NVML, if any
    assert "--nvml-health" not in args


def test_skipping_hosts_fake_nvml_hosts_and_nvml_health_hosts(tmp_path: Path) -> None:
    suite = nodes(
        tmp_path,
        fake_nvml_hosts=("node-2",),
        skip_release_hosts=("node-1", "node-2"),
        nvml_health_hosts=("node-3",),
    )
    skipped, _ = suite.plugin_setup("node-1", tmp_path / "n1")
    assert not any(a.startswith("--host-release-command") for a in skipped)
    fake, env = suite.plugin_setup("node-2", tmp_path / "n2")
    assert "--device-source=nvml" in fake and not any("host-release" in a for a in fake)
    assert env["PYTHONPATH"].startswith(fake_nvml.PYTHONPATH)
    health, env = suite.plugin_setup("node-3", tmp_path / "n3")
    assert "--device-source=redfish" in health and "--nvml-health" in health
    assert any(a.startswith("--host-release-command") for a in health)
    assert env["PYTHONPATH"].startswith(fake_nvml.PYTHONPATH)


def test_a_suites_plugin_args_come_last_on_every_host(tmp_path: Path) -> None:
    suite = nodes(tmp_path, fake_nvml_hosts=("node-2",), extra_plugin_args=("--health-resend=2",))
    for host in ("node-1", "node-2"):
        args, _ = suite.plugin_setup(host, tmp_path / host)
        assert args[-1] == "--health-resend=2"  # last: it wins over any earlier one
