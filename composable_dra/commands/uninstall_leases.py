"""``composable-dra uninstall-leases``: the chart's post-delete hook (docs/operations.md,
Uninstalling).

A controller gives its Lease up at a clean stop (``k8s.leader.Releasable``), but helm
deletes its RBAC together with its Deployment, so a pod stopping after that can no longer
write: its Lease would name a holder that is gone. Once helm has deleted the components,
this deletes their Leases in the release namespace, by name, and nothing else.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", default=None, help="a kubeconfig (omitted: in-cluster)")
    p.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "composable-dra"),
        help="the release namespace, where the Leases are (env POD_NAMESPACE)",
    )
    p.add_argument("lease", nargs="+", help="the Leases' names (their --leader-elect-lease)")


def run(args: argparse.Namespace) -> int:
    from composable_dra.k8s.kube import Kube, KubeError, path

    kube = Kube.from_config(args.kubeconfig, user_agent="composable-dra/uninstall-leases")
    try:
        for lease in args.lease:
            where = path("coordination.k8s.io/v1", "leases", lease, namespace=args.namespace)
            gone = kube.delete(where) is None
            print(f"uninstall-leases: {args.namespace}/{lease} {'absent' if gone else 'deleted'}")
    except (KubeError, ValueError) as exc:
        print(f"uninstall-leases: {exc}", file=sys.stderr)
        return 2
    return 0
