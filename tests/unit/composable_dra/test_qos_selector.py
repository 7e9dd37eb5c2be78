"""``composable-dra qos-selector``: the CEL a claim's request carries for its QoS profile."""

from __future__ import annotations

import re

import pytest

import composable_dra_cli as cli
from composable_dra.lending import netaware, qos
from composable_dra.model import names
from composable_dra.model.gpu_config import parse_parameters
from testbed import examples
from testbed.remote_pods import REMOTE


def test_it_prints_the_selector_of_the_profile(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["qos-selector", "--transfer", "0.5", "--tolerance", "0.1", "--host-load", "0.2"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    expected = qos.cel_selector(qos.QosProfile(0.5, 0.1, 0.2), names.DRIVER)
    assert printed == expected + "\n"


def test_the_host_load_defaults_to_none(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["qos-selector", "--transfer", "0", "--tolerance", "1"]) == 0
    assert capsys.readouterr().out.strip() == qos.cel_selector(
        qos.QosProfile(0.0, 1.0, 0.0), names.DRIVER
    )


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--transfer", "0.5", "--tolerance", "0"], "tolerance"),
        (["--transfer", "-0.1", "--tolerance", "0.1"], "transfer"),
        (["--transfer", "0.5", "--tolerance", "0.1", "--host-load", "1.5"], "host_load"),
        (["--transfer", "nan", "--tolerance", "0.1"], "transfer"),
        (["--transfer", "0.5", "--tolerance", "inf"], "tolerance"),
    ],
)
def test_bad_numbers_are_refused_and_nothing_is_printed(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["qos-selector", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("composable-dra qos-selector: ") and named in err


@pytest.mark.parametrize(
    "driver",
    [
        'gpu.composable.dra.io"] || true || device.attributes["x',
        "gpu\\.composable.dra.io",
        "GPU.composable.dra.io",
        "gpu composable",
        "",
        "a" * 64,
    ],
)
def test_a_driver_name_that_is_not_one_is_refused_and_nothing_is_printed(
    driver: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25.10: the name is written into the CEL, where a quote or a backslash changes
    the expression."""
    argv = ["qos-selector", "--transfer", "0.5", "--tolerance", "0.1", "--driver-name", driver]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("composable-dra qos-selector: driver name ")
    with pytest.raises(qos.SelectorError):
        qos.cel_selector(qos.QosProfile(0.5, 0.1, 0.0), driver)


def test_the_selector_takes_only_the_named_drivers_devices() -> None:
    """Issue 25.10: a domain with no attributes reads as empty, so "publishes no load" held
    for every device under a mistyped name; the selector now requires the driver first
    (tests/e2e/test_qos_selector.py has the scheduler evaluate it)."""
    cel = qos.cel_selector(qos.QosProfile(0.5, 0.1, 0.0), "gpu.example.com")
    assert cel.startswith('device.driver == "gpu.example.com" && (')
    assert cel.endswith(")")


def test_a_number_that_is_not_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["qos-selector", "--transfer", "half", "--tolerance", "0.1"])
    assert exc.value.code == 2
    assert "--transfer" in capsys.readouterr().err


def test_the_example_carries_the_selector_of_the_command_it_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """deploy/examples/remote-qos.yaml, as the e2e test applies it: its QoS selector is
    what the command in its comment prints, its config declares the same profile, and it
    tolerates the link-busy taint."""
    text = (examples.EXAMPLES / "remote-qos.yaml").read_text()
    [command] = re.findall(r"composable-dra (qos-selector .*)", text)
    assert cli.main(command.split()) == 0
    printed = capsys.readouterr().out.strip()
    [template] = [o for o in examples.load("remote-qos") if o["kind"] != "Pod"]
    [request] = template["spec"]["spec"]["devices"]["requests"]
    cels = [s["cel"]["expression"] for s in request["exactly"]["selectors"]]
    assert cels == [REMOTE, printed]
    assert request["exactly"]["tolerations"] == [netaware.INSENSITIVE_TOLERATION]
    [config] = template["spec"]["spec"]["devices"]["config"]
    declared = parse_parameters(config["opaque"]["parameters"]).qos
    args = cli.build_parser().parse_args(command.split())
    assert declared is not None and declared.profile() == qos.QosProfile(
        args.transfer, args.tolerance, args.host_load
    )
