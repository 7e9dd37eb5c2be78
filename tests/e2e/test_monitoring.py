"""The chart's dashboard and alerts against the metrics the running components export.

A whole suite (operator, pool publisher, scaler, a node's plugin) attaches a pool GPU
after a failed attach (quarantined), runs a pod on it and detaches it once idle, while
the fabric reports a free block Warning and a person fences the GPU left attached (the
health panels' data, from the pool publisher and the plugin); a lending lab (donor,
lease controller) opens a lease, runs ``matmul`` on it and closes it. Each component's
/metrics is scraped twice at the end of its run. Every metric a panel or an alert names
must be among the scraped series, and each panel's query, evaluated by promtool over the
scraped samples, must find data: a panel that would always be empty fails.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from composable_dra.k8s.kube import Kube, path
from composable_dra.model.names import ANN_FENCE
from testbed import ControlPlane, monitoring
from testbed.controlplane import free_port
from testbed.harness import Suite
from testbed.monitoring import scrape, total
from testbed.suite_nodes import wait_plugin_registered
from testbed.wait import wait_for
from tests.e2e.conftest import MakeSuite
from tests.e2e.test_remote_lease import RemoteSetup, end_pod_and_claim, lease_and_run, run_matmul

pytestmark = pytest.mark.e2e
API = "composable.dra.io/v1alpha1"
RESOURCE = "resource.k8s.io/v1"
# Admission counts with this link (bytes/s), so that the link-load panel has a capacity.
LINK_BANDWIDTH = 1e9
Scrapes = dict[str, list[str]]  # component -> its scrapes, in order
UNHEALTHY = "composable_dra_device_health_unhealthy"


def wait_metric(port: int, name: str, what: str, describe: Callable[[], str]) -> None:
    wait_for(lambda: total(scrape(port), name) > 0, 90, what, describe=describe)


def scrape_twice(ports: dict[str, int]) -> Scrapes:
    return {c: [scrape(p), scrape(p)] for c, p in ports.items()}


def pool_run(make_suite: MakeSuite, namespace: str) -> Scrapes:
    """Attach two pool GPUs (after a failed attempt, quarantined), run a pod on each,
    release both (idle) and detach one."""
    ports = {c: free_port() for c in ("operator", "pool-publisher", "scaler", "plugin")}
    suite = make_suite(
        hosts=("node-1",),
        quarantine=600,
        no_removal=600,  # the released GPUs stay idle until the end
        operator_args=[f"--metrics-port={ports['operator']}"],
        publisher_args=[f"--metrics-port={ports['pool-publisher']}"],
        scaler_args=[f"--metrics-port={ports['scaler']}"],
    )
    node = suite.nodes["node-1"]
    node.plugin.stop()
    node.plugin.extra_args.append(f"--metrics-port={ports['plugin']}")
    node.plugin.start()
    wait_plugin_registered(node.kubelet, node.plugin, node.name)
    # A standby policy that keeps nothing: the standby gauges, and no standby attach.
    standby = {"maxPerZone": 0, "minPerZone": 0, "windowSeconds": 60, "attachSeconds": 30}
    suite.kube.merge_patch(path(API, "fabrics", suite.fabric), {"spec": {"standby": standby}})
    # The first attach task fails (FabricOperationFailed): its block is quarantined.
    suite.emulator.add_fault({"kind": "task_failure", "count": 1, "path": "AddResourceBlock"})
    pods = ("p1", "p2")
    for pod in pods:
        suite.create_pod(namespace, pod, local_first=False)
    for pod in pods:
        running = functools.partial(suite.running, namespace, pod)
        wait_for(running, 90, f"{pod} to run", describe=suite.describe)
    # A free block degrades (FabricWarning) and stays so: the pool publisher's health
    # series, on both scrapes; its next fabric read sees it while the run goes on.
    suite.emulator.set_block_status(sorted(suite.pool_devices())[0][1], health="Warning")
    quarantined = "composable_dra_scaler_quarantined_devices"
    wait_metric(ports["scaler"], quarantined, "the failed block's quarantine", suite.describe)
    for pod in pods:
        suite.kube.delete(path("v1", "pods", pod, namespace=namespace))
        suite.kube.delete(path(RESOURCE, "resourceclaims", pod, namespace=namespace))
    idle = "composable_dra_scaler_idle_devices"
    wait_for(
        lambda: total(scrape(ports["scaler"]), idle) == 2,
        60,
        "both GPUs idle",
        describe=suite.describe,
    )
    first = suite.resources()[0]["metadata"]["name"]
    suite.kube.delete(path(API, "composableresources", first))
    detached = "composable_dra_detach_seconds_count"
    wait_metric(ports["operator"], detached, "the detach", suite.describe)
    fence_the_attached_gpu(suite, first, ports["plugin"])
    wait_metric(ports["pool-publisher"], UNHEALTHY, "the Warning block counted", suite.describe)
    return scrape_twice(ports)


def fence_the_attached_gpu(suite: Suite, detached: str, plugin_port: int) -> None:
    """Fence the GPU still attached (idle): the node's plugin counts it Quarantined."""
    [left] = [r for r in suite.resources() if r["metadata"]["name"] != detached]
    fence = {"metadata": {"annotations": {ANN_FENCE: "dashboard test"}}}
    suite.kube.merge_patch(path(API, "composableresources", left["metadata"]["name"]), fence)
    # Quarantined itself: the plugin may count the Warning block already (when it is the
    # GPU on its node), which says nothing of the fence.
    wait_for(
        lambda: total(scrape(plugin_port), UNHEALTHY, reason="Quarantined") > 0,
        90,
        "the fenced GPU counted",
        describe=suite.describe,
    )


def lend_run(kube: Kube, cp: ControlPlane, root: Path, unique: str, ns: str) -> Scrapes:
    """Open a lease, run matmul on it and close it."""
    ports = {"donor": free_port(), "lease-controller": free_port()}
    setup = RemoteSetup(kube, cp, root, unique, ns)
    try:
        setup.start()
        # Both again with their metrics, before any lease.
        setup.donor_proc.stop()
        setup.donor_proc.args += [
            f"--metrics-port={ports['donor']}",
            f"--link-bandwidth={LINK_BANDWIDTH}",
        ]
        setup.start_donor()
        [scaler] = setup.procs
        scaler.stop()
        scaler.args.append(f"--metrics-port={ports['lease-controller']}")
        scaler.start()
        _, env, mounts = lease_and_run(setup, "lent")
        run_matmul(env, mounts)
        end_pod_and_claim(setup, "lent")
        # Closed by the consumer's plugin or by the controller, whichever comes first: the
        # donor holds no lease then (the controller's close counter may stay at 0).
        wait_for(
            lambda: total(scrape(ports["donor"]), "remote_gpu_leases_held") == 0,
            90,
            "the lease's close at the donor",
            describe=setup.describe,
        )
        return scrape_twice(ports)
    finally:
        setup.close()


def test_every_panel_and_alert_reads_exported_metrics_and_every_panel_finds_data(
    make_suite: MakeSuite,
    namespace: str,
    kube_json: Kube,
    control_plane: ControlPlane,
    short_tmp: Path,
    unique: str,
) -> None:
    promtool = monitoring.promtool_binary()  # built now (cached) if missing, never skipped
    dashboard, rules = monitoring.rendered()
    panels = monitoring.panel_queries(dashboard)
    alerts = monitoring.rule_queries(rules)
    scrapes = pool_run(make_suite, namespace)
    scrapes |= lend_run(kube_json, control_plane, short_tmp / "lend", unique, namespace)

    exported = monitoring.series_names(scrapes)
    missing = sorted(
        (q.where, name)
        for q in panels + alerts
        for name in monitoring.metric_names(q.expr)
        if name not in exported
    )
    assert not missing, f"named but not exported by any component: {missing}"

    tests = short_tmp / "panels_test.yaml"
    tests.write_text(yaml.safe_dump(monitoring.finds_data_tests(panels, scrapes)))
    assert promtool.exists()
    monitoring.promtool("test", "rules", tests.name, cwd=tests.parent)
