"""``composable-dra qos-selector``: the CEL a claim puts in its request's ``selectors`` so
the scheduler gives it only devices its QoS profile can bear (``lending.qos.cel_selector``,
docs/lending-policy.md)."""

from __future__ import annotations

import argparse
import sys

from composable_dra.lending import qos
from composable_dra.model import names


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--transfer",
        type=float,
        required=True,
        help="the time a remote GPU adds on an idle link, as a fraction of the job's local "
        "run (0..10; 0.3: 30%% longer)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        required=True,
        help="how far past its placement's expected time the job may run (0 < T <= 10)",
    )
    p.add_argument(
        "--host-load",
        type=float,
        default=0.0,
        help="the share of a host's PCIe/memory bandwidth the job adds (0..1; default 0)",
    )
    p.add_argument(
        "--driver-name",
        default=names.DRIVER,
        help="the driver that publishes the attributes (their domain); the selector "
        "refuses every other driver's devices",
    )


def run(args: argparse.Namespace) -> int:
    try:
        profile = qos.QosProfile(
            transfer=args.transfer, tolerance=args.tolerance, host_load=args.host_load
        )
        selector = qos.cel_selector(profile, args.driver_name)
    except (qos.ProfileError, qos.SelectorError) as exc:
        print(f"composable-dra qos-selector: {exc}", file=sys.stderr)
        return 2
    print(selector)
    return 0
