"""The single `composable-dra` command, one subcommand per component.

Each component module exposes ``add_arguments(parser)`` and ``run(args) -> int``. The
modules are imported to declare their flags, so they keep heavy imports inside ``run``:
one component's dependencies never slow another's start. A component whose optional
extra is not installed keeps its subcommand, which then says which extra it needs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from composable_dra import __version__, arenas, logs

# subcommand -> (module, one-line help).
COMPONENTS: dict[str, tuple[str, str]] = {
    "operator": (
        "composable_operator.main",
        "attach and detach fabric devices for ComposableResources (Deployment)",
    ),
    "plugin": ("dra_driver.plugin_main", "the DRA kubelet plugin of one node (DaemonSet)"),
    "remote-gpu-donor": ("remote_gpu.donor_main", "Lend this node's GPU over the network"),
    "fabric-emulator": (
        "fabric_emulator.main",
        "Run the mocked fabric: a stateful Redfish composition service.",
    ),
    "pool-publisher": (
        "pool_publisher.main",
        "Publish each Fabric's free GPUs as ResourceSlice pools (leader-elected)",
    ),
    "scaler": (
        "device_scaler.main",
        "The Dynamic Device Scaler: attach for claims, release, idle scale-down",
    ),
    "qos-selector": (
        "composable_dra.qos_selector",
        "Print the CEL device selector for a claim's QoS profile (network-aware lending)",
    ),
    "migrate-cohdi": (
        "composable_dra.migrate_cohdi",
        "Convert CoHDI ComposabilityRequests (YAML) into this suite's",
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
    for name, (module, help_text) in COMPONENTS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        try:
            importlib.import_module(module).add_arguments(p)
        except ModuleNotFoundError as exc:  # an optional extra is not installed
            p.set_defaults(_missing=str(exc))
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
    code: int = importlib.import_module(args._module).run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())


class Flags(Protocol):
    """A parser or one of its argument groups."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...


def env_flag(
    parser: Flags,
    flag: str,
    default: str | None = None,
    *,
    env: str | None = None,
    **kwargs: Any,
) -> None:
    """Add ``flag`` with its default read from the environment variable named like it
    (``--state-dir``: STATE_DIR, or ``env``), else ``default``; an empty variable counts
    as unset. argparse converts a string default with the flag's ``type``, as it would
    the flag's own value, so a bad variable fails like a bad flag."""
    name = env or flag.removeprefix("--").replace("-", "_").upper()
    parser.add_argument(flag, default=os.environ.get(name) or default, **kwargs)
