"""The chart's values for lending through it: lending nodes with a plugin of their own
(plugin.lend.nodeSelector), donors' lease API URLs by node (remoteGPU.donorApis) and the
donors' CA mounted from a Secret or a ConfigMap (remoteGPU.donorCA)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import chart
from testbed import chart_cluster as cc
from testbed.chart_lend import LEND_VALUES
from tests.unit.deploy.test_chart import Obj, by_kind, container, one

LENDERS = {"composable.dra.io/lend": "true"}
LEND_GPU = {"uuid": "GPU-lend", "productName": "A100", "model": "A100", "memory": "80Gi"}
CA_PATH = "/var/run/composable-dra/donor-ca/ca.crt"


def render(values: dict[str, Any]) -> list[Obj]:
    """The chart rendered with ``values`` from a file (chart.render's --set-json splits
    the dotted label keys this module uses)."""
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "values.yaml"
        f.write_text(yaml.safe_dump(values))
        return chart.render(values_files=[f])


def lending(**plugin: Any) -> dict[str, Any]:
    lend = {"enabled": True, "networkDomain": "rack-1", "nodeSelector": LENDERS}
    return {"plugin": {**plugin, "lend": {**lend, **plugin.pop("lend", {})}}}


def pod_spec(workload: Obj) -> Obj:
    spec: Obj = workload["spec"]["template"]["spec"]
    return spec


def not_lenders(plugin_ds: Obj) -> list[Obj]:
    affinity = pod_spec(plugin_ds)["affinity"]["nodeAffinity"]
    terms: list[Obj] = affinity["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    return terms


def test_lending_nodes_get_a_plugin_daemonset_of_their_own_the_others_do_not_lend() -> None:
    objs = render(
        lending(
            deviceSource="static",
            static={"devices": []},
            nodeSelector={"gpu": "yes"},
            lend={"static": {"devices": [LEND_GPU]}},
        )
    )
    plain, lender = one(objs, "DaemonSet", "-plugin"), one(objs, "DaemonSet", "-plugin-lend")
    assert "--lend" not in container(plain)["args"]
    assert not_lenders(plain) == [
        {
            "matchExpressions": [
                {"key": "composable.dra.io/lend", "operator": "NotIn", "values": ["true"]}
            ]
        }
    ]
    assert pod_spec(plain)["nodeSelector"] == {"gpu": "yes"}
    assert {"--lend", "--network-domain=rack-1"} <= set(container(lender)["args"])
    assert pod_spec(lender)["nodeSelector"] == {"gpu": "yes", **LENDERS}
    assert "affinity" not in pod_spec(lender)
    # One identity for both: the plugin's RBAC and admission policy hold for the lenders.
    accounts = {pod_spec(d)["serviceAccountName"] for d in (plain, lender)}
    assert accounts == {"cdra-composable-dra-plugin"}
    # Each reads its own device list; each has its metrics Service.
    devices = {c["metadata"]["name"]: c["data"]["devices.yaml"] for c in by_kind(objs, "ConfigMap")}
    assert devices["cdra-composable-dra-plugin-devices"].strip() == "devices: []"
    assert "GPU-lend" in devices["cdra-composable-dra-plugin-lend-devices"]
    volumes = {v["name"]: v for v in pod_spec(lender)["volumes"]}
    assert volumes["devices"]["configMap"]["name"] == "cdra-composable-dra-plugin-lend-devices"
    assert (
        one(objs, "Service", "-plugin-lend-metrics")["spec"]["selector"][
            "app.kubernetes.io/component"
        ]
        == "plugin-lend"
    )


def test_without_lending_nodes_every_plugin_lends_as_before() -> None:
    objs = render({"plugin": {"lend": {"enabled": True, "networkDomain": "r"}}})
    (ds,) = [d for d in by_kind(objs, "DaemonSet") if "-plugin" in d["metadata"]["name"]]
    assert "--lend" in container(ds)["args"]
    assert "affinity" not in pod_spec(ds)
    assert not [s for s in by_kind(objs, "Service") if "plugin-lend" in s["metadata"]["name"]]
    # A node selector for lenders with lending off changes nothing.
    off = render({"plugin": {"lend": {"nodeSelector": LENDERS}}})
    assert [d["metadata"]["name"] for d in by_kind(off, "DaemonSet")] == [
        "cdra-composable-dra-plugin"
    ]


def test_fabric_nodes_read_the_fabric_while_the_lenders_read_their_own_gpus() -> None:
    values = lending(deviceSource="redfish", lend={"deviceSource": "nvml"})
    objs = render({**values, "emulator": {"enabled": True}})
    plain = container(one(objs, "DaemonSet", "-plugin"))
    lender = container(one(objs, "DaemonSet", "-plugin-lend"))
    assert "--device-source=redfish" in plain["args"]
    assert "--device-source=nvml" in lender["args"]
    assert not [a for a in lender["args"] if a.startswith("--redfish")]
    # The donor runs where the lenders are.
    donor_values = {"enabled": True, "donor": {"enabled": True, "tlsSecret": "t"}}
    objs = render({**values, "emulator": {"enabled": True}, "remoteGPU": donor_values})
    donor = one(objs, "DaemonSet", "-remote-gpu-donor")
    assert pod_spec(donor)["nodeSelector"] == LENDERS


def test_lending_nodes_and_a_node_affinity_of_the_plugin_are_refused_together() -> None:
    affinity: Obj = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    with pytest.raises(chart.HelmError, match=r"plugin\.affinity\.nodeAffinity"):
        render(lending(affinity=affinity))
    with pytest.raises(chart.HelmError, match="deviceSource"):
        render(lending(lend={"deviceSource": "gpu"}))


def lease_callers(objs: list[Obj]) -> list[Obj]:
    """The plugin's and the scaler's containers."""
    return [
        container(one(objs, "DaemonSet", "-plugin")),
        container(one(objs, "Deployment", "-scaler")),
    ]


def test_donor_apis_are_passed_by_node_to_the_plugin_and_the_scaler() -> None:
    apis = {"gpu-7": "https://10.0.3.7:7471", "gpu-8": "https://gpu-8.lab:7000"}
    objs = render({"remoteGPU": {"enabled": True, "donorApis": apis}})
    for c in lease_callers(objs):
        flags = [a for a in c["args"] if a.startswith("--donor-api=")]
        assert flags == [f"--donor-api={n}={u}" for n, u in sorted(apis.items())]
    # The schema names the bad value (where it is, helm's validator may misplace).
    for bad, named in (
        ({"gpu-7": "http://10.0.3.7:7471"}, "http://"),
        ({"Gpu_7": "https://x"}, "Gpu_7"),
    ):
        with pytest.raises(chart.HelmError, match=named):
            render({"remoteGPU": {"enabled": True, "donorApis": bad}})


@pytest.mark.parametrize(
    ("kind", "source"),
    [
        (
            "secret",
            {"secret": {"secretName": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ),
        (
            "configMap",
            {"configMap": {"name": "ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ),
    ],
)
def test_the_donors_ca_is_mounted_into_the_plugin_and_the_scaler(kind: str, source: Obj) -> None:
    remote = {"enabled": True, "donorCA": {kind: "ca"}}
    objs = render({"remoteGPU": remote, **lending()})
    workloads = [one(objs, "DaemonSet", s) for s in ("-plugin", "-plugin-lend")]
    workloads.append(one(objs, "Deployment", "-scaler"))
    for w in workloads:
        volumes = {v["name"]: v for v in pod_spec(w)["volumes"]}
        assert volumes["donor-ca"] == {"name": "donor-ca", **source}
        mounts = {m["name"]: m for m in container(w)["volumeMounts"]}
        assert mounts["donor-ca"]["readOnly"] is True
        assert CA_PATH.startswith(mounts["donor-ca"]["mountPath"] + "/")
        assert f"--donor-ca-file={CA_PATH}" in container(w)["args"]
    # Remote GPUs off: nothing mounted.
    off = render({"remoteGPU": {"donorCA": {kind: "ca"}}})
    assert "donor-ca" not in {
        v["name"] for v in pod_spec(one(off, "DaemonSet", "-plugin"))["volumes"]
    }


def test_the_donors_ca_comes_from_one_place() -> None:
    both = {"enabled": True, "donorCA": {"secret": "a", "configMap": "b"}}
    with pytest.raises(chart.HelmError, match="not both"):
        render({"remoteGPU": both})
    with_file = {"enabled": True, "donorCA": {"secret": "a"}, "donorCAFile": "/etc/ca.crt"}
    with pytest.raises(chart.HelmError, match="donorCAFile"):
        render({"remoteGPU": with_file})
    # donorCAFile alone: passed as is, nothing mounted.
    objs = render({"remoteGPU": {"enabled": True, "donorCAFile": "/etc/ca.crt"}})
    for c in lease_callers(objs):
        assert "--donor-ca-file=/etc/ca.crt" in c["args"]
        assert "donor-ca" not in {m["name"] for m in c["volumeMounts"]}


def test_the_local_cluster_lend_values_render() -> None:
    """testbed's values for a remote lease on real nodes (test_chart_lend): the lenders'
    plugin and the donor on labelled nodes, the CA from the ConfigMap the test creates."""
    objs = chart.render(values_files=[cc.VALUES, LEND_VALUES])
    # The demo's: the fabric nodes read the fabric, the donor its own GPU.
    demo = chart.render(values_files=[cc.VALUES, cc.POOL_VALUES, LEND_VALUES])
    assert "--device-source=redfish" in container(one(demo, "DaemonSet", "-plugin"))["args"]
    assert "--device-source=static" in container(one(demo, "DaemonSet", "-plugin-lend"))["args"]
    lender = one(objs, "DaemonSet", "-plugin-lend")
    donor = one(objs, "DaemonSet", "-remote-gpu-donor")
    assert pod_spec(lender)["nodeSelector"] == pod_spec(donor)["nodeSelector"] == LENDERS
    assert f"--donor-ca-file={CA_PATH}" in container(one(objs, "Deployment", "-scaler"))["args"]
