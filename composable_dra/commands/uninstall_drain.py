"""``composable-dra uninstall-drain``: the chart's pre-delete hook (docs/operations.md,
Uninstalling).

Run while the components still run, before ``helm uninstall`` deletes them. While any
claim holds a GPU of our driver it refuses, removing nothing (exit 3, the claims and pods
named: helm prints the hook's log and the release stays). Otherwise it hands the suite's
objects back in order (``uninstall_plan.DRAIN_ORDER``), each kind gone before the next, so
that the operator, still running, detaches every GPU back to its pool and removes its
finalizers: nothing is left for a controller that no longer exists.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from composable_dra.commands import uninstall_plan as plan
from composable_dra.model import names

if TYPE_CHECKING:  # the client is imported in run: the CLI imports this module for its flags
    from composable_dra.k8s.kube import Kube

REFUSED = 3
TIMED_OUT = 4
# How often it reads what is left while the operator detaches.
PASS_SECONDS = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None, help="a kubeconfig (omitted: in-cluster)")
    p.add_argument("--driver-name", default=names.DRIVER, help="the DRA driver's name")
    p.add_argument(
        "--timeout",
        type=float,
        default=240.0,
        help="seconds for every object to be gone (keep it under helm's --timeout)",
    )


def run(args: argparse.Namespace) -> int:
    from composable_dra.k8s.kube import Kube, KubeError

    kube = Kube.from_config(args.kubeconfig, user_agent="composable-dra/uninstall-drain")
    try:
        return drain(kube, args.driver_name, time.monotonic() + args.timeout)
    except KubeError as exc:
        print(f"uninstall-drain: the API server refused: {exc}", file=sys.stderr)
        return 2


def drain(kube: Kube, driver: str, deadline: float) -> int:
    """Refuse, or delete every kind of DRAIN_ORDER and wait for it to be gone."""
    from composable_dra.k8s.kube import path

    held = plan.holders(kube.get(path("resource.k8s.io/v1", "resourceclaims"))["items"], driver)
    if held:
        print(plan.refusal(held, driver), file=sys.stderr)
        return REFUSED
    for plural in plan.DRAIN_ORDER:
        if plural == "composableresources":
            _stop_standby(kube)
        left = _delete_all(kube, plural, deadline)
        if left:
            print(
                f"uninstall-drain: {plural} not gone within the timeout: {', '.join(left)}; "
                "see the operator's log and the objects' conditions",
                file=sys.stderr,
            )
            return TIMED_OUT
        print(f"uninstall-drain: every {plural} handed back", flush=True)
    return 0


def _stop_standby(kube: Kube) -> None:
    """A Fabric's warm standby would attach again what is being detached."""
    from composable_dra.k8s.kube import path

    for fabric in kube.get(path(plan.GROUP_VERSION, "fabrics"))["items"]:
        if (fabric.get("spec") or {}).get("standby"):
            name = fabric["metadata"]["name"]
            kube.merge_patch(path(plan.GROUP_VERSION, "fabrics", name), {"spec": {"standby": None}})


def _delete_all(kube: Kube, plural: str, deadline: float) -> list[str]:
    """Delete every object of ``plural`` (again for any made meanwhile) until none is
    left; the names still there at ``deadline``."""
    from composable_dra.k8s.kube import path

    while True:
        items = kube.get(path(plan.GROUP_VERSION, plural))["items"]
        if not items:
            return []
        for name in plan.to_delete(items):
            kube.delete(path(plan.GROUP_VERSION, plural, name))
        if time.monotonic() > deadline:
            left = kube.get(path(plan.GROUP_VERSION, plural))["items"]
            return sorted(str(o["metadata"]["name"]) for o in left)
        time.sleep(PASS_SECONDS)
