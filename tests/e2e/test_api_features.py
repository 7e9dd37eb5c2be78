"""What the components find the API server serves, on the default release (v1.37.1, every
feature on) and on v1.35 (built by hack/control-plane/build.sh with KUBE_VERSION when not
cached, as any missing binaries are): the probes are real dry-run creates, and a plugin
asked to lend on v1.35 refuses at start naming the feature gate it lacks; in v1.35's
gated run (its alpha gates on), the probes find what the gates turned on."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.feature_probe import Probes, detect
from composable_dra.k8s.features import ApiFeatures, Feature
from composable_dra.k8s.kube import Kube, path
from testbed import ControlPlane, versions
from testbed.controlplane import RELEASES, find_binaries, free_port
from testbed.nodes import create_node, delete_node
from testbed.plugin_process import PluginProcess, write_static_devices
from testbed.process import ComponentProcess
from testbed.wait import wait_for
from tests.e2e.test_plugin import gpu

DRIVER = "gpu.composable.dra.io"


def probes_for(node: str) -> Probes:
    """What the plugin (lending), the pool publisher and the scaler probe, together."""
    return Probes(DRIVER, node=node, slices=True, partitions=True, taint_rules=True)


@pytest.fixture(scope="module")
def v135(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A v1.35 control plane: the session's on a v1.35 run (testbed/versions.py)."""
    if versions.minor(versions.run_release()) == "1.35":
        yield request.getfixturevalue("control_plane")
        return
    with ControlPlane(find_binaries(version=RELEASES["1.35"]), tmp_path_factory.mktemp("cp")) as cp:
        yield cp


def lending_plugin(node: str, cp: ControlPlane, root: Path, *args: str) -> PluginProcess:
    """A lending plugin of ``node`` with one GPU and no kubelet (not started)."""
    lend = ["--lend", "--network-domain=d", "--link-gbps=100", "--max-leases=2", *args]
    plugin = PluginProcess.standalone(node, cp.kubeconfig, root, lend)
    write_static_devices(plugin.static_file, [gpu(node, 0)])
    return plugin


def reported(cp: ControlPlane, component: str, root: Path) -> dict[str, object]:
    """The one "api features" line of ``component`` (pool-publisher, scaler) started
    against ``cp``; it is stopped after."""
    args = [f"--kubeconfig={cp.kubeconfig}", "--no-leader-elect"]
    proc = ComponentProcess(component, args, root / component).start()

    def line() -> list[dict[str, object]]:
        return [e for e in proc.log_events() if e.get("event") == "api features"]

    try:
        wait_for(line, 60, f"the {component}'s api features", describe=proc.log_tail)
        wait_for(
            lambda: any(e.get("event") == "started" for e in proc.log_events()),
            30,
            f"the {component} to start",
            describe=proc.log_tail,
        )
    finally:
        proc.stop()
    (found,) = line()
    return found


def kube_of(cp: ControlPlane) -> Kube:
    return Kube.from_config(str(cp.kubeconfig))


def probed(kube: Kube, unique: str) -> ApiFeatures:
    """What every probe finds, for a node made for it (and deleted)."""
    node = f"probe-{unique}"
    create_node(kube.api, node)
    try:
        return detect(kube, probes_for(node))
    finally:
        delete_node(kube.api, node)


def test_v137_serves_every_feature_and_stores_nothing(
    kube_json: Kube, control_plane: ControlPlane, unique: str
) -> None:
    node = f"probe-{unique}"
    create_node(kube_json.api, node)
    try:
        found = detect(kube_json, probes_for(node))
        pool = detect(kube_json, Probes(DRIVER, slices=True))  # the pool publisher's probe
    finally:
        delete_node(kube_json.api, node)
    assert found.present == set(Feature), found.why
    assert pool.present == {Feature.RESOURCE_V1, Feature.BINDING_CONDITIONS, Feature.DEVICE_TAINTS}
    assert "v1" in found.versions
    # Dry runs: no probe object is left behind.
    slices = kube_json.get(path("resource.k8s.io/v1", "resourceslices"))["items"]
    rules = kube_json.get(path("resource.k8s.io/v1", "devicetaintrules"))["items"]
    assert not [o for o in slices + rules if "feature-probe" in o["metadata"]["name"]]


def test_v137_lending_plugin_says_what_it_uses_in_a_line_and_a_metric(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> None:
    node = f"donor-{unique}"
    create_node(kube_json.api, node)
    port = free_port()
    plugin = lending_plugin(node, control_plane, short_tmp, f"--metrics-port={port}")
    try:
        plugin.start()
        wait_for(
            lambda: plugin.logged("plugin started"), 60, "the plugin", describe=plugin.log_tail
        )
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    finally:
        plugin.stop()
        delete_node(kube_json.api, node)
    lines = [e for e in plugin.process.log_events() if e.get("event") == "api features"]
    assert len(lines) == 1, plugin.log_tail()
    assert lines[0]["missing"] == ""
    assert lines[0]["uses"] == (
        "resource-v1,binding-conditions,partitionable-devices,device-taints"
    )
    for feature in ("resource-v1", "binding-conditions", "partitionable-devices"):
        assert f'composable_dra_api_feature{{feature="{feature}"}} 1.0' in metrics.decode()


@pytest.mark.parametrize(
    ("component", "v137", "v135_missing"),
    [
        (
            "pool-publisher",
            "resource-v1,binding-conditions,device-taints",
            "binding-conditions,device-taints",
        ),
        ("scaler", "resource-v1,device-taint-rules", "device-taint-rules"),
    ],
)
def test_the_controllers_report_what_they_write_and_start_anyway_on_v135(
    control_plane: ControlPlane,
    v135: ControlPlane,
    short_tmp: Path,
    component: str,
    v137: str,
    v135_missing: str,
) -> None:
    new = reported(control_plane, component, short_tmp / "v137")
    assert (new["uses"], new["missing"]) == (v137, "")
    old = reported(v135, component, short_tmp / "v135")
    assert (old["uses"], old["missing"]) == ("resource-v1", v135_missing)


@pytest.mark.versions("1.35")
def test_v135_lacks_the_gated_features(v135: ControlPlane, unique: str) -> None:
    kube = kube_of(v135)
    found = probed(kube, unique)
    version = kube.get("/version")["gitVersion"]
    assert version == RELEASES["1.35"]
    assert found.present == {Feature.RESOURCE_V1}, found.why
    assert found.missing(Feature) == [
        Feature.BINDING_CONDITIONS,
        Feature.PARTITIONABLE_DEVICES,
        Feature.DEVICE_TAINTS,
        Feature.DEVICE_TAINT_RULES,
    ]
    assert "dropped the field" in found.why[Feature.BINDING_CONDITIONS]
    assert "404" in found.why[Feature.DEVICE_TAINT_RULES]


@pytest.mark.versions("1.35")
def test_v135_lending_plugin_refuses_naming_the_gate(
    v135: ControlPlane, short_tmp: Path, unique: str
) -> None:
    kube = kube_of(v135)
    node = f"donor-{unique}"
    create_node(kube.api, node)
    plugin = lending_plugin(node, v135, short_tmp)
    try:
        plugin.start()
        wait_for(
            lambda: not plugin.alive(), 60, "the lending plugin to refuse", describe=plugin.log_tail
        )
        code = plugin.stop()
    finally:
        plugin.stop()
        delete_node(kube.api, node)
    text = plugin.log_path.read_text()
    assert code != 0, text
    (line,) = [e for e in plugin.process.log_events() if e.get("event") == "api features"]
    assert line["uses"] == "resource-v1", text
    assert line["missing"] == "binding-conditions,partitionable-devices,device-taints", text
    assert "lending (--lend) needs" in text, text
    assert "DRAPartitionableDevices" in text and "DRADeviceBindingConditions" in text, text
    # It wrote nothing before refusing.
    slices = kube.get(path("resource.k8s.io/v1", "resourceslices"))["items"]
    assert not [s for s in slices if s["spec"]["pool"]["name"] == node]


# Only in v1.35's gated run (testbed/versions.py GATED): the session's control plane and
# kubelets have DRADeviceBindingConditions and DRAPartitionableDevices on.
@pytest.mark.versions(default=False, gated=("1.35",))
def test_v135_with_its_gates_on_the_components_find_the_features(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> None:
    assert kube_json.get("/version")["gitVersion"] == RELEASES["1.35"]
    found = probed(kube_json, unique)
    assert found.missing(Feature) == [Feature.DEVICE_TAINTS, Feature.DEVICE_TAINT_RULES]
    # The pool publisher, started with no flag for it, uses binding conditions.
    line = reported(control_plane, "pool-publisher", short_tmp)
    assert (line["uses"], line["missing"]) == ("resource-v1,binding-conditions", "device-taints")
