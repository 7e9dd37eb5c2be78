"""The demo's cluster with `make demo DEMO_ARGS=--chart`: the product installed once by
its Helm chart, with the fabric's pool and with lending on.

Four real nodes: three carry the systemUUIDs of the chart emulator's built-in hosts (the
fabric reaches them: testbed.chart_cluster), the fourth, :data:`DONOR`, is labelled to
lend and tainted for the lenders only (testbed.chart_lend), so it runs the chart's
plugin-lend and donor DaemonSet pods and nothing else. `helm install` with
testbed/chart-values.yaml, chart-pool-values.yaml and chart-lend-values.yaml.

The borrower (the last fabric node) joins the donor's network domain only when the
remote step starts (:meth:`DemoLending.lease`): until then the donor's remote device
admits no node, so no example's claim takes it (composable-gpu with no selector matches
any GPU of the driver, a remote twin too).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from composable_dra.k8s.kube import Kube
from testbed import chart_cluster as cc
from testbed import chart_lend as lend
from testbed.controlplane import ControlPlane
from testbed.product_image import find_product_image
from testbed.realnode import RealNode
from testbed.realnodes import started_nodes

HOSTS = ("node-1", "node-2", "node-3")  # the emulator's built-in topology: all three
DONOR = "lend-demo"


def scaler_args(idle_seconds: float) -> list[str]:
    """The scaler's extra flags: chart-lend-values.yaml's (helm replaces a list, never
    merges it) and the demo's idle window."""
    lend_values: dict[str, Any] = yaml.safe_load(lend.LEND_VALUES.read_text())
    return [*lend_values["scaler"]["extraArgs"], f"--no-removal-duration={idle_seconds:g}"]


@dataclass
class DemoLending:
    """The donor and the borrower of the demo's remote step."""

    kube: Kube
    donor: RealNode
    borrower: RealNode
    nodes: Sequence[RealNode]
    image: str

    def lease(self, namespace: str, args: Sequence[str]) -> lend.RemoteRun:
        """The borrower in the donor's network domain, then the matmul pod on it, with a
        claim for a remote GPU, until it ends."""
        lend.join_domain(self.kube, self.borrower)
        return lend.run_matmul(self.kube, namespace, self.borrower, self.image, args, self.nodes)


@contextlib.contextmanager
def demo_suite(
    cp: ControlPlane,
    kube: Kube,
    bin_dir: Path,
    workdir: Path,
    idle_seconds: float,
    line: Callable[[str], None],
) -> Iterator[tuple[cc.ChartSuite, DemoLending]]:
    """The chart installed on the demo's four nodes (the scaler's idle window
    ``idle_seconds``), its pools and the donor's remote device published; all stopped at
    the end (the nodes take the chart's pods with them)."""
    image = find_product_image()
    line(f"image {image.ref} ({image.archive})")
    names_ = [*(f"{h}-demo" for h in HOSTS), DONOR]
    uuids = cc.host_uuids(HOSTS)
    with started_nodes(cp, bin_dir, workdir, names_, [image.archive], uuids) as nodes:
        *fabric, donor = nodes
        lend.label_nodes(kube, donor, [])
        lend.donor_pki(kube, donor, workdir)
        flags = ["--set-json", f"scaler.extraArgs={json.dumps(scaler_args(idle_seconds))}"]
        values = [cc.VALUES, cc.POOL_VALUES, lend.LEND_VALUES]
        cc.helm_install(cp, image.tag, values, [*flags, *lend.donor_api_flags(donor)])
        line(f"helm install {cc.RELEASE} deploy/helm/composable-dra -n {cc.NAMESPACE}")
        route = cc.route_fabric(kube, nodes)
        line(f"the chart's fabric emulator at http://{route.cluster_ip}:{route.port}")
        cc.wait_pools(kube, nodes)
        lend.wait_remote_device(kube, nodes)
        line(f"{donor.name} lends its GPU (labelled {lend.LEND_LABEL}=true, tainted)")
        real = dict(zip(HOSTS, fabric, strict=True)) | {DONOR: donor}
        suite = cc.ChartSuite(kube, nodes, image.ref, real)
        yield suite, DemoLending(kube, donor, fabric[-1], nodes, image.ref)
