"""The single `composable-dra` command, one subcommand per component.

It sits above the components, apart from the shared library ``composable_dra``, because
its subcommand table imports every one of them (the import contracts in pyproject.toml).
Each component module exposes ``add_arguments(parser)`` and ``run(args) -> int``. The
modules are imported to declare their flags, so they keep heavy imports inside ``run``:
one component's dependencies never slow another's start. The donor's module, which needs
an optional extra, is imported only when the parser is built: without the extra its
subcommand stays and says which extra it needs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from composable_dra import __version__
from composable_dra.commands import (
    migrate_cohdi,
    qos_selector,
    uninstall_drain,
    uninstall_leases,
)
from composable_dra.process import logs
from composable_dra_cli import arenas
from composable_operator import main as operator_main
from device_scaler import main as scaler_main
from dra_driver import plugin_main
from fabric_emulator import main as emulator_main
from pool_publisher import main as pool_publisher_main


def _donor() -> ModuleType:
    """The donor needs the optional 'remote' extra (numpy): imported when the parser is
    built, so that without it the subcommand stays and says what to install."""
    from remote_gpu import donor_main

    return donor_main


# subcommand -> (its module's loader, one-line help).
COMPONENTS: dict[str, tuple[Callable[[], ModuleType], str]] = {
    "operator": (
        lambda: operator_main,
        "attach and detach fabric devices for ComposableResources (Deployment)",
    ),
    "plugin": (lambda: plugin_main, "the DRA kubelet plugin of one node (DaemonSet)"),
    "remote-gpu-donor": (_donor, "Lend this node's GPU over the network"),
    "fabric-emulator": (
        lambda: emulator_main,
        "Run the mocked fabric: a stateful Redfish composition service.",
    ),
    "pool-publisher": (
        lambda: pool_publisher_main,
        "Publish each Fabric's free GPUs as ResourceSlice pools (leader-elected)",
    ),
    "scaler": (
        lambda: scaler_main,
        "The Dynamic Device Scaler: attach for claims, release, idle scale-down",
    ),
    "qos-selector": (
        lambda: qos_selector,
        "Print the CEL device selector for a claim's QoS profile (network-aware lending)",
    ),
    "migrate-cohdi": (
        lambda: migrate_cohdi,
        "Convert CoHDI ComposabilityRequests (YAML) into this suite's",
    ),
    "uninstall-drain": (
        lambda: uninstall_drain,
        "Before helm uninstall (the chart's pre-delete hook): refuse while a claim holds a "
        "GPU, else hand every GPU back and remove the suite's objects",
    ),
    "uninstall-leases": (
        lambda: uninstall_leases,
        "After helm uninstall (the chart's post-delete hook): delete the controllers' Leases",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="composable-dra",
        description="Kubernetes DRA driver suite for GPUs from a disaggregated pool.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    parser.add_argument(
        "--log-format",
        default="auto",
        choices=["auto", "json", "console"],
        help="auto: readable on a terminal, JSON otherwise",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (load, help_text) in COMPONENTS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            module = load()
        except ModuleNotFoundError as exc:  # an optional extra is not installed
            p.set_defaults(_missing=str(exc))
            continue
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "_missing", None):  # its flags are unknown: say what is missing
        print(f"composable-dra {args.command}: {args._missing}", file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logs.configure(args.command, args.log_level, args.log_format)
    arenas.limit()  # before the component starts its threads
    code: int = args._module.run(args)
    return code
