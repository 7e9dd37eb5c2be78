"""testbed.chart_demo: the demo's one `helm install` with the pool and lending on, and
its borrower joining the donor's network domain only at the remote step."""

from __future__ import annotations

from unittest import mock

from dra_driver.slices import NETWORK_DOMAIN_LABEL
from testbed import chart
from testbed import chart_cluster as cc
from testbed import chart_demo as demo
from testbed import chart_lend as lend
from tests.unit.deploy.test_chart import container, one


def test_the_scaler_keeps_the_lending_flags_and_gets_the_idle_window() -> None:
    # helm replaces a list given again: the lend values' flags are kept by hand.
    assert demo.scaler_args(15) == ["--lease-resync=1", "--no-removal-duration=15"]
    assert demo.scaler_args(2.5)[-1] == "--no-removal-duration=2.5"


def test_one_install_has_the_pool_plugin_the_lenders_and_the_lease_controller() -> None:
    apis = {demo.DONOR: "https://10.1.0.2:7471"}
    objs = chart.render(
        values_files=[cc.VALUES, cc.POOL_VALUES, lend.LEND_VALUES],
        values={"scaler": {"extraArgs": demo.scaler_args(15)}, "remoteGPU": {"donorApis": apis}},
    )
    plugin = container(one(objs, "DaemonSet", "-plugin"))["args"]
    assert "--device-source=redfish" in plugin and "--lend" not in plugin
    lender = one(objs, "DaemonSet", "-plugin-lend")
    assert {"--device-source=static", "--lend"} <= set(container(lender)["args"])
    selector = lender["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == {lend.LEND_LABEL: "true"}
    assert one(objs, "DaemonSet", "-donor")
    scaler = container(one(objs, "Deployment", "-scaler"))["args"]
    assert {"--lease-resync=1", "--no-removal-duration=15"} <= set(scaler)


def test_the_borrower_joins_the_domain_only_when_it_borrows() -> None:
    kube, donor, borrower = mock.Mock(), mock.Mock(), mock.Mock()
    borrower.name = "node-3-demo"
    lending = demo.DemoLending(kube, donor, borrower, [], "img")
    # The pod is created only once the borrower is in the domain.
    ran = mock.Mock(side_effect=lambda *_: kube.merge_patch.assert_called_once())
    kube.merge_patch.assert_not_called()
    with mock.patch.object(lend, "run_matmul", ran):
        lending.lease("demo-remote", ["--calls", "8"])
    labels = {"metadata": {"labels": {NETWORK_DOMAIN_LABEL: lend.DOMAIN}}}
    kube.merge_patch.assert_called_once_with("/api/v1/nodes/node-3-demo", labels)
    ran.assert_called_once_with(kube, "demo-remote", borrower, "img", ["--calls", "8"], [])
