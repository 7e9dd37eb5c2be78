"""The Helm chart: lint, render, and what the rendered objects say.

helm comes from hack/helm.sh (built from source when missing, never skipped).
"""

from __future__ import annotations

import filecmp
from pathlib import Path
from typing import Any

import pytest

from composable_dra.lending.remote_leases import DONORS_AUDIENCE
from composable_dra.model import names
from composable_dra.model.device_classes import device_classes
from composable_dra_cli import build_parser
from testbed import chart
from testbed import chart_cluster as cc

ALL_ENABLED = chart.CHART / "ci" / "all-enabled-values.yaml"
KIND_VALUES = chart.ROOT / "hack" / "kind" / "values.yaml"
Obj = dict[str, Any]


def by_kind(objs: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[Obj], kind: str, name_suffix: str = "") -> Obj:
    found = [o for o in by_kind(objs, kind) if o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"{kind} *{name_suffix}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(workload: Obj) -> Obj:
    containers: list[Obj] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@pytest.fixture(scope="module")
def default() -> list[Obj]:
    return chart.render()


@pytest.fixture(scope="module")
def everything() -> list[Obj]:
    return chart.render(values_files=[ALL_ENABLED])


def test_lint_strict() -> None:
    out = chart.helm("lint", "--strict", str(chart.CHART))
    assert "0 chart(s) failed" in out
    out = chart.helm("lint", "--strict", str(chart.CHART), "--values", str(ALL_ENABLED))
    assert "0 chart(s) failed" in out


def test_chart_crds_are_the_generated_ones() -> None:
    """deploy/crds is the one source; the chart's crds/ is a copy (hack/chart-crds.sh)."""
    src = sorted(p.name for p in (chart.ROOT / "deploy" / "crds").glob("*.yaml"))
    dst = sorted(p.name for p in (chart.CHART / "crds").glob("*.yaml"))
    assert src == dst, "run hack/chart-crds.sh"
    _, mismatch, errors = filecmp.cmpfiles(
        chart.ROOT / "deploy" / "crds", chart.CHART / "crds", src, shallow=False
    )
    assert not mismatch and not errors, (
        f"stale chart CRDs {mismatch + errors}: run hack/chart-crds.sh"
    )
    crds = by_kind(chart.render(include_crds=True), "CustomResourceDefinition")
    assert {c["metadata"]["name"] for c in crds} == {
        "fabrics.composable.dra.io",
        "composableresources.composable.dra.io",
        "composabilityrequests.composable.dra.io",
    }


def test_default_render(default: list[Obj]) -> None:
    kinds = {o["kind"] for o in default}
    assert {"DaemonSet", "Deployment", "DeviceClass", "ValidatingAdmissionPolicy"} <= kinds
    # Optional parts are off by default.
    assert not {"ServiceMonitor", "Fabric", "Secret"} & kinds
    assert len(by_kind(default, "Deployment")) == 3  # pool publisher, scaler, operator

    # The chart's classes are the suite's (the local one rejects pool devices).
    classes = by_kind(default, "DeviceClass")
    assert [(c["metadata"]["name"], c["spec"]) for c in classes] == [
        (want["metadata"]["name"], want["spec"]) for want in device_classes()
    ]
    # No extended resource by default.
    assert not any("extendedResourceName" in c["spec"] for c in classes)


ATTACHMENT = f'device.attributes["{names.DRIVER}"].attachment'


@pytest.mark.parametrize(
    ("devices", "which"),
    [
        ("nodeFirst", f'{ATTACHMENT} != "remote"'),
        ("poolOnly", f'{ATTACHMENT} in ["pool", "fabric"]'),
    ],
)
def test_extended_resource_class(devices: str, which: str) -> None:
    """extendedResource.name maps the name to a class of its own, without remote leases
    (nodeFirst) or with fabric GPUs only (poolOnly); the main class stays as it was."""
    values = {"extendedResource": {"name": "nvidia.com/gpu", "devices": devices}}
    classes = {
        c["metadata"]["name"]: c for c in by_kind(chart.render(values=values), "DeviceClass")
    }
    extended = classes.pop("composable-gpu-extended")
    assert classes and not any("extendedResourceName" in c["spec"] for c in classes.values())
    assert extended["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert extended["spec"]["selectors"] == [
        {"cel": {"expression": f'device.driver == "{names.DRIVER}" && {which}'}}
    ]


@pytest.mark.parametrize("name", ["nvidia.com/gpu/x", "bad name", "-gpu", "x" * 254])
def test_extended_resource_name_refused_by_the_schema(name: str) -> None:
    with pytest.raises(chart.HelmError, match="extendedResource"):
        chart.render(values={"extendedResource": {"name": name}})


def test_plugin_daemonset(default: list[Obj]) -> None:
    ds = one(default, "DaemonSet", "-plugin")
    c = container(ds)
    assert c["args"][2:4] == ["plugin", f"--driver-name={names.DRIVER}"]
    assert "--device-source=nvml" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    # Seamless upgrade: the new pod surges beside the old one, its sockets named by its UID.
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    host_paths = {v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
        "/var/run/cdi",
    } <= host_paths
    assert c["livenessProbe"]["grpc"]["port"] == 51515
    assert "--health-port=51515" in c["args"]


@pytest.mark.parametrize("source", ["static", "redfish", "nvml"])
def test_plugin_device_source(source: str) -> None:
    values: dict[str, Any] = {"plugin": {"deviceSource": source}}
    if source == "redfish":
        values["plugin"]["redfish"] = {
            "endpoint": "https://fabric.example:8443",
            "credentialsSecret": "creds",
        }
    objs = chart.render(values=values)
    args = container(one(objs, "DaemonSet"))["args"]
    assert f"--device-source={source}" in args
    assert any(a.startswith("--static-file=") for a in args) == (source == "static")
    assert ("--redfish-endpoint=https://fabric.example:8443" in args) == (source == "redfish")
    assert any(o["kind"] == "ConfigMap" for o in objs) == (source == "static")


def test_plugin_lending_is_off_by_default_and_flags_follow_values(default: list[Obj]) -> None:
    args = container(one(default, "DaemonSet"))["args"]
    assert not any(a.startswith(("--lend", "--max-leases")) for a in args)
    values = {
        "plugin": {
            "lend": {
                "enabled": True,
                "linkGbps": 200,
                "maxLeases": 5,
                "transports": "tcp,ucx",
                "borrowers": "example.com/tier=gpu-less",
            }
        }
    }
    args = container(one(chart.render(values=values), "DaemonSet"))["args"]
    for flag in (
        "--lend",
        "--link-gbps=200",
        "--max-leases=5",
        "--lend-transports=tcp,ucx",
        "--borrowers=example.com/tier=gpu-less",
        "--link-busy-at=0.7",
        "--link-clear-at=0.5",
    ):
        assert flag in args
    assert not any(a.startswith("--network-domain") for a in args)  # the node label
    for bad in (
        {"maxLeases": 0},
        {"transports": "shm"},
        {"networkDomain": "a b"},
        {"linkBusyAt": 2},
        {"hostSlowdownAtFull": 0},
        {"hostBandwidth": -1},
    ):
        with pytest.raises(chart.HelmError, match="lend"):
            chart.render(values={"plugin": {"lend": bad}})


def test_plugin_qos_attributes_are_off_by_default_and_need_both_values() -> None:
    lend: dict[str, Any] = {"enabled": True}
    args = container(one(chart.render(values={"plugin": {"lend": lend}}), "DaemonSet"))["args"]
    assert not any(a.startswith("--host-") for a in args)
    lend.update(hostSlowdownAtFull=0.2, hostBandwidth=25000000000)
    args = container(one(chart.render(values={"plugin": {"lend": lend}}), "DaemonSet"))["args"]
    found = dict(a.split("=", 1) for a in args if a.startswith("--host-"))
    assert float(found["--host-slowdown-at-full"]) == 0.2
    assert float(found["--host-bandwidth"]) == 25e9
    with pytest.raises(chart.HelmError, match=r"needs plugin\.lend\.hostBandwidth"):
        chart.render(values={"plugin": {"lend": {"enabled": True, "hostSlowdownAtFull": 0.2}}})


def test_redfish_source_needs_an_endpoint() -> None:
    with pytest.raises(chart.HelmError, match=r"needs plugin\.redfish\.endpoint"):
        chart.render(values={"plugin": {"deviceSource": "redfish"}})


def test_schema_refuses_bad_values() -> None:
    with pytest.raises(chart.HelmError, match="deviceSource"):
        chart.render(values={"plugin": {"deviceSource": "cuda"}})
    with pytest.raises(chart.HelmError, match="additional properties 'replica' not allowed"):
        chart.render(values={"scaler": {"replica": 3}})
    # Fabric manager credentials belong in the Secret, never in an endpoint URL.
    leaky = "https://admin:secret@fabric.example:8443"
    with pytest.raises(chart.HelmError, match="endpoint"):
        chart.render(values={"fabric": {"create": True, "endpoint": leaky}})
    with pytest.raises(chart.HelmError, match="maxPerZone"):
        chart.render(values={"fabric": {"create": True, "standby": {"maxPerZone": -1}}})
    with pytest.raises(chart.HelmError, match="endpoint"):
        chart.render(values={"plugin": {"deviceSource": "redfish", "redfish": {"endpoint": leaky}}})


def test_controllers_are_leader_elected(default: list[Obj]) -> None:
    for name in ("pool-publisher", "scaler", "operator"):
        dep = one(default, "Deployment", f"-{name}")
        args = container(dep)["args"]
        assert name in args
        assert "--leader-elect-namespace=composable-dra" in args
        assert "--metrics-port=9090" in args
        assert dep["spec"]["replicas"] == 2
        lease = one(default, "Role", f"-{name}-leader-election")
        assert lease["rules"] == [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update", "patch"],
            }
        ]
    single = chart.render(values={"leaderElection": {"enabled": False}})
    for dep in by_kind(single, "Deployment"):
        assert dep["spec"]["replicas"] == 1
        args = container(dep)["args"]
        assert "--no-leader-elect" in args
        assert not any(a.startswith("--leader-elect-namespace") for a in args)
    assert not [r for r in by_kind(single, "Role") if "leader" in r["metadata"]["name"]]


def test_one_service_account_per_component(default: list[Obj]) -> None:
    sas = {o["metadata"]["name"] for o in by_kind(default, "ServiceAccount")}
    workloads = by_kind(default, "Deployment") + by_kind(default, "DaemonSet")
    workloads += by_kind(default, "Job")  # the uninstall hooks', one account for both
    used = [w["spec"]["template"]["spec"]["serviceAccountName"] for w in workloads]
    assert sorted(set(used)) == sorted(sas)
    assert len(set(used)) == 5


def test_the_uninstall_hook_drains_before_helm_deletes_and_only_then_exists(
    default: list[Obj],
) -> None:
    every = [o for o in default if "helm.sh/hook" in o["metadata"].get("annotations", {})]
    hooks = [o for o in every if "pre-delete" in o["metadata"]["annotations"]["helm.sh/hook"]]
    kinds = sorted(o["kind"] for o in hooks)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Job", "ServiceAccount"]
    for o in every:
        notes = o["metadata"]["annotations"]
        assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
        # The account and its role first, then the Job that uses them.
        assert int(notes["helm.sh/hook-weight"]) == (0 if o["kind"] == "Job" else -10)
    (job,) = by_kind(hooks, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook-output-log-policy"] == "hook-failed"
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 300
    c = container(job)
    assert c["args"][-3:] == [
        "uninstall-drain",
        "--driver-name=gpu.composable.dra.io",
        "--timeout=240",
    ]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    (role,) = by_kind(hooks, "ClusterRole")
    verbs = {
        (r["apiGroups"][0], res, v)
        for r in role["rules"]
        for res in r["resources"]
        for v in r["verbs"]
    }
    cr = "composable.dra.io"
    assert verbs == {
        ("resource.k8s.io", "resourceclaims", "list"),
        *(
            (cr, k, v)
            for k in ("composabilityrequests", "composableresources", "fabrics")
            for v in ("list", "delete")
        ),
        (cr, "fabrics", "patch"),
    }
    post = [o for o in every if "post-delete" in o["metadata"]["annotations"]["helm.sh/hook"]]
    assert sorted(o["kind"] for o in post) == ["Job", "Role", "RoleBinding", "ServiceAccount"]
    off = chart.render(values={"uninstall": {"drain": False}})
    assert not [o for o in off if "uninstall" in o["metadata"]["name"]]


def test_no_component_reads_secrets_cluster_wide(everything: list[Obj]) -> None:
    for role in by_kind(everything, "ClusterRole"):
        for rule in role["rules"]:
            assert "secrets" not in rule["resources"], role["metadata"]["name"]
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
    secret_roles = [
        r
        for r in by_kind(everything, "Role")
        if any("secrets" in x["resources"] for x in r["rules"])
    ]
    assert {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in secret_roles} == {
        ("composable-dra-credentials", "cdra-composable-dra-operator-fabric-secrets"),
        ("composable-dra-credentials", "cdra-composable-dra-pool-publisher-fabric-secrets"),
    }


def test_everything_enabled(everything: list[Obj]) -> None:
    sm = one(everything, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    services = [
        s for s in by_kind(everything, "Service") if s["metadata"]["name"].endswith("-metrics")
    ]
    assert len(services) == 4
    for s in services:
        assert s["metadata"]["labels"]["composable.dra.io/metrics"] == "true"

    emulator_svc = one(everything, "Service", "-fabric-emulator")
    url = f"http://{emulator_svc['metadata']['name']}.composable-dra.svc:8000"
    fabric = one(everything, "Fabric")
    assert fabric["spec"]["endpoint"] == url
    assert fabric["spec"]["caSecret"] == {"name": "fabric-ca", "namespace": "composable-dra"}
    assert fabric["spec"]["standby"] == {
        "maxPerZone": 2,
        "windowSeconds": 300,
        "attachSeconds": 30,
    }
    creds = one(everything, "Secret", "-fabric-credentials")
    assert fabric["spec"]["credentialsSecret"]["name"] == creds["metadata"]["name"]
    assert creds["stringData"] == {"username": "admin", "password": "admin"}

    plugin = container(one(everything, "DaemonSet", "-plugin"))
    assert f"--redfish-endpoint={url}" in plugin["args"]
    assert "--redfish-ca-file=/etc/composable-dra/redfish-ca/ca.crt" in plugin["args"]
    env = {e["name"]: e for e in plugin["env"]}
    assert env["REDFISH_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": creds["metadata"]["name"],
        "key": "password",
    }
    emulator = container(one(everything, "Deployment", "-fabric-emulator"))
    assert "--topology=/etc/fabric-emulator/topology/topology.yaml" in emulator["args"]
    assert "--async-polls=2" in emulator["args"]
    # The admin API (fault injection) is guarded by a generated token in the Secret.
    assert "--admin-token-file=/etc/fabric-emulator/admin-token" in emulator["args"]
    emu_secret = one(everything, "Secret", "-fabric-emulator")
    assert len(emu_secret["stringData"]["admin-token"]) == 32


def test_a_fixed_emulator_address_is_what_the_components_reach() -> None:
    """With emulator.clusterIP the Service gets that address and the Fabric and the
    plugin reach the emulator by it, not by a DNS name a cluster without DNS cannot
    resolve; a value that is no address is refused by the schema."""
    values = {
        "emulator": {"enabled": True, "clusterIP": "10.0.0.80"},
        "fabric": {"create": True, "credentials": {"create": True}},
        "plugin": {"deviceSource": "redfish"},
    }
    objs = chart.render(values=values)
    assert one(objs, "Service", "-fabric-emulator")["spec"]["clusterIP"] == "10.0.0.80"
    assert one(objs, "Fabric")["spec"]["endpoint"] == "http://10.0.0.80:8000"
    plugin = container(one(objs, "DaemonSet", "-plugin"))
    assert "--redfish-endpoint=http://10.0.0.80:8000" in plugin["args"]
    six = chart.render(values={**values, "emulator": {"enabled": True, "clusterIP": "fd00::50"}})
    assert one(six, "Fabric")["spec"]["endpoint"] == "http://[fd00::50]:8000"
    with pytest.raises(chart.HelmError, match="schema"):
        chart.render(values={"emulator": {"enabled": True, "clusterIP": "emulator"}})


def test_extra_args_follow_the_subcommand() -> None:
    objs = chart.render(values={"scaler": {"extraArgs": ["--no-removal-duration=60"]}})
    args = container(one(objs, "Deployment", "-scaler"))["args"]
    assert args.index("--no-removal-duration=60") > args.index("scaler")


def node_writers(objs: list[Obj]) -> dict[str, list[str]]:
    """ClusterRole name -> the verbs beyond reading that it has on Nodes."""
    out: dict[str, list[str]] = {}
    for role in by_kind(objs, "ClusterRole"):
        for rule in role.get("rules") or []:
            if "" in rule.get("apiGroups", []) and "nodes" in rule.get("resources", []):
                verbs = [v for v in rule["verbs"] if v not in ("get", "list", "watch")]
                if verbs:
                    out.setdefault(role["metadata"]["name"], []).extend(verbs)
    return out


def test_the_pool_publisher_labels_nodes_by_default_and_may_patch_them_only_then(
    default: list[Obj],
) -> None:
    """poolPublisher.labelNodes: the flag, and patch on Nodes (no create: an apply to a
    Node that is gone must not make one), for the publisher alone."""
    args = container(one(default, "Deployment", "-pool-publisher"))["args"]
    assert "--label-nodes" in args
    writers = node_writers(default)
    assert [(n.endswith("-pool-publisher"), v) for n, v in writers.items()] == [(True, ["patch"])]
    off = chart.render(values={"poolPublisher": {"labelNodes": False}})
    assert "--no-label-nodes" in container(one(off, "Deployment", "-pool-publisher"))["args"]
    assert node_writers(off) == {}


@pytest.mark.parametrize(
    ("component", "policy"), [("plugin", "-own-node"), ("pool-publisher", "-zone-labels")]
)
def test_admission_policy_names_its_component(
    default: list[Obj], component: str, policy: str
) -> None:
    vap = one(default, "ValidatingAdmissionPolicy", policy)
    sa = one(default, "ServiceAccount", f"-{component}")["metadata"]["name"]
    (cond,) = vap["spec"]["matchConditions"]
    assert f'"system:serviceaccount:composable-dra:{sa}"' in cond["expression"]
    binding = one(default, "ValidatingAdmissionPolicyBinding", policy)
    assert binding["spec"] == {
        "policyName": vap["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    off = chart.render(values={"admissionPolicy": {"enabled": False}})
    assert not by_kind(off, "ValidatingAdmissionPolicy")


def test_the_zone_label_policy_comes_and_goes_with_label_nodes() -> None:
    off = chart.render(values={"poolPublisher": {"labelNodes": False}})
    assert [p["metadata"]["name"] for p in by_kind(off, "ValidatingAdmissionPolicy")] == [
        "cdra-composable-dra-plugin-own-node"
    ]


def test_kind_values_render() -> None:
    objs = chart.render(values_files=[KIND_VALUES])
    args = container(one(objs, "DaemonSet"))["args"]
    assert "--device-source=redfish" in args
    assert one(objs, "Fabric")
    assert one(objs, "Deployment", "-fabric-emulator")


def test_the_local_cluster_pool_values_render() -> None:
    """testbed's values for the chart on real nodes with its emulator (test_chart_pool,
    the demo's --chart): the emulator at its fixed address, a Fabric for it, the plugin
    reading it, the image never pulled."""
    objs = chart.render(values_files=[cc.VALUES, cc.POOL_VALUES])
    url = f"http://{cc.emulator_address()}:8000"
    assert one(objs, "Fabric")["spec"]["endpoint"] == url
    plugin = container(one(objs, "DaemonSet", "-plugin"))
    assert {"--device-source=redfish", f"--redfish-endpoint={url}"} <= set(plugin["args"])
    assert plugin["imagePullPolicy"] == "Never"
    svc = one(objs, "Service", "-fabric-emulator")
    assert svc["metadata"]["name"] == cc.EMULATOR


def test_paths_exist() -> None:
    for p in (chart.CHART / "values.schema.json", KIND_VALUES, Path(chart.ROOT / "Dockerfile")):
        assert p.is_file(), p


def test_remote_gpu_leases_rbac_is_least_privilege(
    default: list[Obj], everything: list[Obj]
) -> None:
    assert not any(
        "lease-tokens" in o["metadata"]["name"] or o["metadata"]["name"].endswith("-donor")
        for o in default
    )
    assert not any(a.startswith("--lease-") for a in container(one(default, "DaemonSet"))["args"])
    sa = "cdra-composable-dra-scaler"
    role = one(everything, "Role", "-scaler-lease-tokens")
    # The lease controller: tokens of its own service account, nothing else.
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts/token"],
            "resourceNames": [sa],
            "verbs": ["create"],
        }
    ]
    binding = one(everything, "RoleBinding", "-scaler-lease-tokens")
    assert binding["subjects"][0]["name"] == sa
    # The plugin creates no token: a node could bind one to another node.
    assert not [o for o in everything if o["metadata"]["name"].endswith("-plugin-lease-tokens")]
    scaler = container(one(everything, "Deployment", "-scaler"))["args"]
    plugin_ds = one(everything, "DaemonSet", "-plugin")
    plugin = container(plugin_ds)["args"]
    assert f"--lease-service-account=composable-dra/{sa}" in scaler
    assert not [a for a in plugin if a.startswith("--lease-service-account")]
    for args in (scaler, plugin):
        assert "--donor-api-template=https://{node}:7471" in args
        assert "--donor-ca-file=/etc/composable-dra/donor-ca/ca.crt" in args
    # Its proof is its pod's own token, for the donors' audience, mounted where the flag
    # says.
    volumes = {v["name"]: v for v in plugin_ds["spec"]["template"]["spec"]["volumes"]}
    (source,) = volumes["lease-token"]["projected"]["sources"]
    assert source["serviceAccountToken"] == {
        "path": "token",
        "audience": DONORS_AUDIENCE,
        "expirationSeconds": 600,
    }
    mount = next(m for m in container(plugin_ds)["volumeMounts"] if m["name"] == "lease-token")
    assert mount["readOnly"] is True
    assert f"--lease-token-file={mount['mountPath']}/token" in plugin
    donor = one(everything, "ClusterRole", "-remote-gpu-donor")
    assert donor["rules"] == [
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        },
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    ]
    assert one(everything, "ServiceAccount", "-remote-gpu-donor")
    assert not [r for r in by_kind(everything, "Role") if "donor-leader" in r["metadata"]["name"]]
    with pytest.raises(chart.HelmError, match="donorApiTemplate"):
        chart.render(values={"remoteGPU": {"donorApiTemplate": "http://{node}:80"}})


def test_the_donor_runs_on_lending_nodes_with_its_lease_api_and_its_own_identity(
    default: list[Obj], everything: list[Obj]
) -> None:
    assert not [
        o for o in by_kind(default, "DaemonSet") if o["metadata"]["name"].endswith("-donor")
    ]
    donor = one(everything, "DaemonSet", "-remote-gpu-donor")
    pod = donor["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["serviceAccountName"] == "cdra-composable-dra-remote-gpu-donor"
    args = container(donor)["args"]
    for flag in (
        "remote-gpu-donor",
        "--name=$(NODE_NAME)",
        "--advertise=$(NODE_IP):7470",
        "--lease-api-listen=0.0.0.0:7471",
        "--lease-controller-sa=composable-dra/cdra-composable-dra-scaler",
        "--lease-plugin-sa=composable-dra/cdra-composable-dra-plugin",
        "--allow=matmul=remote_gpu.builtins:matmul",
        "--link-bandwidth=12500000000",  # plugin.lend.linkGbps (100) in bytes/s
        "--status-window=10",
        "--latency-model=matmul=0.01:0.002",
    ):
        assert flag in args, flag
    # Its token key is a Secret of its own, mounted read-only; TLS from the named Secret.
    secret = one(everything, "Secret", "-remote-gpu-donor-secret")
    assert secret["data"]["key"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["donor-secret"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert volumes["donor-tls"]["secret"]["secretName"] == "donor-tls"
    assert container(donor)["securityContext"]["readOnlyRootFilesystem"] is True
    on = {"enabled": True, "donor": {"enabled": True, "tlsSecret": "t"}}
    with pytest.raises(chart.HelmError, match=r"needs plugin\.lend\.enabled"):
        chart.render(values={"remoteGPU": on})
    with pytest.raises(chart.HelmError, match="tlsSecret"):
        chart.render(
            values={
                "remoteGPU": {"enabled": True, "donor": {"enabled": True}},
                "plugin": {"lend": {"enabled": True}},
            }
        )
    with pytest.raises(chart.HelmError, match="allow"):
        chart.render(
            values={
                "remoteGPU": {**on, "donor": {**on["donor"], "allow": ["os.system"]}},  # type: ignore[dict-item]
                "plugin": {"lend": {"enabled": True}},
            }
        )


def grants_pod_delete(role: Obj) -> bool:
    return any(
        "" in rule.get("apiGroups", [])
        and "pods" in rule["resources"]
        and {"delete", "deletecollection", "*"} & set(rule["verbs"])
        for rule in role["rules"]
    )


def test_no_cluster_role_may_delete_pods_the_vendor_restart_is_namespaced(
    default: list[Obj], everything: list[Obj]
) -> None:
    vendor = {"vendorDrivers": ["gpu.nvidia.com"], "vendorPluginNamespace": "nvidia-dra"}
    with_ns = chart.render(values=vendor)
    without_ns = chart.render(values={"vendorDrivers": ["gpu.nvidia.com"]})
    for objs in (default, everything, with_ns, without_ns):
        assert not [r for r in by_kind(objs, "ClusterRole") if grants_pod_delete(r)]

    # Pod deletion: one Role, in the vendor plugin's namespace, bound to the scaler only.
    [role] = [r for r in by_kind(with_ns, "Role") if grants_pod_delete(r)]
    assert role["metadata"]["namespace"] == "nvidia-dra"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}]
    [binding] = [
        b
        for b in by_kind(with_ns, "RoleBinding")
        if b["roleRef"]["name"] == role["metadata"]["name"]
    ]
    assert binding["metadata"]["namespace"] == "nvidia-dra"
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": "cdra-composable-dra-scaler",
            "namespace": "composable-dra",
        }
    ]
    scaler = one(with_ns, "Deployment", "-scaler")
    assert "--vendor-plugin-namespace=nvidia-dra" in container(scaler)["args"]

    # Without a namespace (or without vendor drivers) no pod may be deleted anywhere.
    for objs in (default, without_ns, chart.render(values={"vendorPluginNamespace": "x"})):
        assert not [r for r in by_kind(objs, "Role") if grants_pod_delete(r)]
        args = container(one(objs, "Deployment", "-scaler"))["args"]
        assert not any(a.startswith("--vendor-plugin-namespace") for a in args)
    with pytest.raises(chart.HelmError, match="vendorPluginNamespace"):
        chart.render(values={"vendorPluginNamespace": "../etc"})


def test_safe_detach_is_on_by_default_and_the_plugin_s_host_flags_follow_values(
    default: list[Obj],
) -> None:
    args = container(one(default, "Deployment", "-operator"))["args"]
    assert "--await-host-release" in args and "--host-release-timeout=120" in args
    plugin = container(one(default, "DaemonSet"))["args"]
    assert not any(a.startswith("--host-release-command") for a in plugin)
    for other in ("-scaler", "-pool-publisher"):
        assert not any(
            "host-release" in a for a in container(one(default, "Deployment", other))["args"]
        )
    command = "sh -c 'echo 1 > /sys/bus/pci/devices/$COMPOSABLE_DRA_PCI_BUS_ID/remove'"
    objs = chart.render(
        values={
            "operator": {"awaitHostRelease": False, "hostReleaseTimeout": 30},
            "plugin": {"hostReleaseCommand": command, "nvmlHealth": True},
        }
    )
    assert "--nvml-health" in container(one(objs, "DaemonSet"))["args"]
    assert "--nvml-health" not in plugin
    args = container(one(objs, "Deployment", "-operator"))["args"]
    assert "--no-await-host-release" in args and "--host-release-timeout=30" in args
    assert f"--host-release-command={command}" in container(one(objs, "DaemonSet"))["args"]


def test_the_post_delete_hook_deletes_exactly_the_controllers_leases(default: list[Obj]) -> None:
    (job,) = [j for j in by_kind(default, "Job") if j["metadata"]["name"].endswith("-leases")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-delete"
    args = container(job)["args"]
    leases = args[args.index("--namespace=composable-dra") + 1 :]
    # The names the components lead with (their --leader-elect-lease defaults).
    parser = build_parser()
    defaults = {
        parser.parse_args([cmd]).leader_elect_lease
        for cmd in ("pool-publisher", "scaler", "operator")
    }
    assert set(leases) == defaults
    (role,) = [r for r in by_kind(default, "Role") if r["metadata"]["name"].endswith("-drain")]
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": leases,
            "verbs": ["delete"],
        }
    ]
