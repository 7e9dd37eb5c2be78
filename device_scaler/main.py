"""``composable-dra scaler``: the Dynamic Device Scaler (leader-elected)."""

from __future__ import annotations

import argparse
import re
from typing import Any

from api.v1alpha1 import DNS_LABEL
from composable_dra.lending.remote_leases import add_client_arguments
from composable_dra.process.component import add_common_arguments, run_controller


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common_arguments(p, lease="composable-dra-scaler")
    p.add_argument(
        "--attach-timeout",
        type=float,
        default=300.0,
        help="seconds from a ComposableResource's creation to Online before FabricDeviceFailed",
    )
    p.add_argument(
        "--no-removal-duration",
        type=float,
        default=600.0,
        help="seconds an idle attached GPU stays attached after its last use",
    )
    p.add_argument(
        "--failure-quarantine",
        type=float,
        default=60.0,
        help="seconds a pool device whose attach failed is tainted NoSchedule",
    )
    p.add_argument(
        "--fail-on-fabric-error",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="fail the allocation as soon as the operator reports a failed fabric operation "
        "(else wait for Failed or the attach timeout)",
    )
    p.add_argument(
        "--resync", type=float, default=1.0, help="seconds between passes without events"
    )
    p.add_argument(
        "--vendor-plugin-namespace",
        default="",
        type=_namespace,
        help="vendor-driver mode: restart vendor plugins (delete their pods) only in this "
        "namespace; a Fabric naming another gets no restarts (empty: any namespace)",
    )
    add_client_arguments(p, "lease controller")
    p.add_argument(
        "--lease-resync",
        type=float,
        default=5.0,
        help="seconds between reads of each donor's leases (closes what no claim holds)",
    )


def _namespace(value: str) -> str:
    """A namespace name (DNS label) or empty."""
    if value and (len(value) > 63 or not re.fullmatch(DNS_LABEL, value)):
        raise argparse.ArgumentTypeError(f"not a namespace name: {value!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from composable_dra.k8s.feature_probe import Probes, check_at_start
    from composable_dra.k8s.features import Feature
    from composable_dra.process import logs
    from device_scaler.decide import ScalerSettings
    from device_scaler.leases import Together
    from device_scaler.scaler import Scaler, ScalerConfig

    settings = ScalerSettings(
        driver=args.driver_name,
        attach_timeout=args.attach_timeout,
        no_removal=args.no_removal_duration,
        quarantine=args.failure_quarantine,
        fail_on_fabric_error=args.fail_on_fabric_error,
    )

    def make(kube: Any) -> Any:
        # Its quarantine writes DeviceTaintRules: say whether this server serves them.
        probes = Probes(args.driver_name, taint_rules=True)
        found = check_at_start(kube, probes, [], logs.get("scaler"), "scaler")
        scaler = Scaler(
            kube,
            ScalerConfig(
                settings,
                resync=args.resync,
                vendor_plugin_namespace=args.vendor_plugin_namespace or None,
                taint_rules=Feature.DEVICE_TAINT_RULES in found.present,
            ),
        )
        if not args.lease_service_account:
            return scaler
        return Together(scaler, _lease_controller(args, kube))

    return run_controller(args, "scaler", make)


def _lease_controller(args: argparse.Namespace, kube: Any) -> Any:
    """The lease controller (remote GPUs), under the scaler's leader election."""
    from composable_dra.lending.remote_leases import client_from_args
    from device_scaler.leases import LeaseController, LeaseSettings

    client = client_from_args(args, kube)
    return LeaseController(
        kube, client, LeaseSettings(driver=args.driver_name, resync=args.lease_resync)
    )
