"""The installed chart's lifecycle on a real node (kubelet v1.37.1, containerd, runc; the
product image imported): `helm uninstall`, `helm upgrade` and the CRDs' upgrade step as
users run them (docs/operations.md, Upgrading the release and Uninstalling).

- uninstall: refused by the chart's pre-delete hook while a pod holds one of the plugin's
  GPUs (the hook says why, the release and everything in it stay); once the pod is gone it
  drains while the operator still runs, and leaves no ComposableResource (so no
  finalizer), no ResourceSlice of the driver, no Lease, no pod and no hook object.
- upgrade to a second tag of the image: the plugin DaemonSet's seamless roll (both pods'
  registration sockets in the kubelet's log, pods started all through the roll prepared,
  the new pod preparing), a pod holding its GPU running on, each Lease held by a new pod.
- CRDs: `helm upgrade` leaves them as they were; the documented server-side apply of the
  chart's crds/ brings a new field in.

The control plane is this file's own, with the ServiceAccount admission plugin, as
tests/e2e/test_chart_install.py has it. The times from each helm command to its end state
are printed.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.model import names
from testbed import chart
from testbed.controlplane import ControlPlane
from testbed.objects import create_claim, create_resource, pod_body
from testbed.product_image import ProductImage, find_product_image
from testbed.realnode import RealNode
from testbed.realnode_pods import for_real_node
from testbed.realnodes import ENV_AND_WAIT, gone, started_nodes, wait_running
from testbed.wait import wait_for
from tests.e2e.test_chart_install import (
    CONTROLLERS,
    NAMESPACE,
    RELEASE,
    VALUES,
    leaders,
    plugin_registered,
    pods_of,
    running,
    sa_control_plane,
)

pytestmark = pytest.mark.e2e
__all__ = ["sa_control_plane"]  # the module's control plane, a fixture of this file too

HOOK = f"{RELEASE}-composable-dra-uninstall-drain"
CR = "composable.dra.io/v1alpha1"


@pytest.fixture
def node(sa_control_plane: ControlPlane, node_bin_dir: Path, short_tmp: Path) -> Iterator[RealNode]:
    image = find_product_image()
    name = f"l-{uuid.uuid4().hex[:6]}"
    with started_nodes(sa_control_plane, node_bin_dir, short_tmp, [name], [image.archive]) as made:
        yield made[0]


def admin(cp: ControlPlane) -> Kube:
    return Kube.from_config(str(cp.kubeconfig), user_agent="composable-dra/test-chart-lifecycle")


def helm(cp: ControlPlane, verb: str, *args: str) -> str:
    """helm ``verb`` of the test's release, in its namespace, on this control plane."""
    return chart.helm(
        verb, RELEASE, *args, "--namespace", NAMESPACE, "--kubeconfig", str(cp.kubeconfig)
    )


def install(cp: ControlPlane, image: ProductImage, *values: str) -> None:
    helm(
        cp,
        "install",
        str(chart.CHART),
        "--create-namespace",
        "--values",
        str(VALUES),
        "--set",
        f"image.tag={image.tag}",
        *values,
    )


def wait_installed(kube: Kube, node: RealNode) -> dict[str, str]:
    """Until the node's plugin pod registered and published, and each controller leads;
    the leading pods by component."""
    wait_for(
        functools.partial(plugin_registered, node, kube),
        180,
        f"the chart's plugin pod on {node.name} to register and publish",
        interval=0.5,
        describe=node.logs_tail,
    )

    def all_lead() -> dict[str, str] | None:
        got = leaders(kube)
        return got if len(got) == len(CONTROLLERS) else None

    held: dict[str, str] = wait_for(all_lead, 180, "each controller to lead", interval=0.5)
    return held


@pytest.fixture(autouse=True)
def no_release_left(sa_control_plane: ControlPlane) -> Iterator[None]:
    """Each test installs afresh: one that failed midway leaves no release behind it (its
    own uninstall, the scenario's end, makes this a no-op otherwise)."""
    yield
    helm(sa_control_plane, "uninstall", "--ignore-not-found", "--no-hooks")


@pytest.fixture
def work(sa_control_plane: ControlPlane) -> Iterator[str]:
    """A namespace for the test's pods, deleted afterwards."""
    kube = admin(sa_control_plane)
    name = f"w-{uuid.uuid4().hex[:6]}"
    kube.create(path("v1", "namespaces"), {"metadata": {"name": name}})
    yield name
    kube.delete(path("v1", "namespaces", name))


def installed(
    cp: ControlPlane, node: RealNode, *values: str
) -> tuple[Kube, ProductImage, dict[str, str]]:
    """The chart installed with ``values`` and up on ``node``: an admin client, the image,
    the leading pods by component."""
    kube = admin(cp)
    image = find_product_image()
    install(cp, image, *values)
    return kube, image, wait_installed(kube, node)


def gpu_pod(kube: Kube, node: RealNode, ns: str, name: str) -> JSON:
    """A claim for one of our GPUs and a pod on ``node`` that holds it."""
    create_claim(kube, ns, name)
    pod = pod_body(name, name, command=["sh", "-c", ENV_AND_WAIT])
    created: JSON = kube.create(
        path("v1", "pods", namespace=ns), for_real_node(pod, node.name, node.image)
    )
    return created


def delete_pod(kube: Kube, ns: str, name: str) -> None:
    """Delete the pod and its claim, and wait until the claim is gone (deallocated)."""
    kube.delete(path("v1", "pods", name, namespace=ns))
    claim = path("resource.k8s.io/v1", "resourceclaims", name, namespace=ns)
    kube.delete(claim)
    wait_for(gone(kube, claim), 60, f"claim {ns}/{name} to go", interval=0.3)


def leftovers(kube: Kube) -> list[str]:
    """What an uninstall must not leave: the suite's objects (and so their finalizers),
    the driver's ResourceSlices, a Lease holder, the components' pods, the hook's objects."""
    left = [
        f"{plural}/{o['metadata']['name']} finalizers={o['metadata'].get('finalizers')}"
        for plural in ("composableresources", "composabilityrequests", "fabrics")
        for o in kube.get(path(CR, plural))["items"]
    ]
    slices = kube.get(path("resource.k8s.io/v1", "resourceslices"))["items"]
    left += [
        f"slice {s['metadata']['name']}" for s in slices if s["spec"]["driver"] == names.DRIVER
    ]
    leases = kube.get(path("coordination.k8s.io/v1", "leases", namespace=NAMESPACE))["items"]
    left += [f"lease {x['metadata']['name']}: {x['spec']}" for x in leases]
    pods = kube.get(path("v1", "pods", namespace=NAMESPACE))["items"]
    left += [f"pod {p['metadata']['name']}" for p in pods]
    rbac = "rbac.authorization.k8s.io/v1"
    for kind, ns in (
        ("clusterroles", None),
        ("clusterrolebindings", None),
        ("roles", NAMESPACE),
        ("rolebindings", NAMESPACE),
    ):
        if kube.get_or_none(path(rbac, kind, HOOK, namespace=ns)) is not None:
            left.append(f"{kind}/{HOOK}")
    return left


def hook_message(kube: Kube) -> str:
    """What the failed hook's container said (its termination message: the log's end)."""
    pods = kube.get(path("v1", "pods", namespace=NAMESPACE), labelSelector=f"job-name={HOOK}")
    (pod,) = pods["items"]
    (status,) = pod["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert terminated["exitCode"] == 3, terminated
    return str(terminated.get("message", "")).strip()


# Long because it is one scenario read top to bottom: refused, then drained.
def test_helm_uninstall_is_refused_while_a_pod_holds_a_gpu_then_leaves_nothing(
    node: RealNode, sa_control_plane: ControlPlane, work: str
) -> None:
    cp = sa_control_plane
    kube, _, _ = installed(cp, node)
    gpu_pod(kube, node, work, "holder")
    wait_running(kube, node, work, "holder")
    # A resource of a fabric that is not there: the operator puts its finalizer on it.
    create_resource(kube, "orphan-1", "no-such-fabric", "block-1", node.name)
    orphan = path(CR, "composableresources", "orphan-1")
    wait_for(
        lambda: names.FINALIZER in (kube.get(orphan)["metadata"].get("finalizers") or []),
        60,
        "the operator's finalizer on the resource",
        interval=0.3,
    )

    # Refused: helm prints the hook's reason and removes nothing.
    with pytest.raises(chart.HelmError) as refused:
        helm(cp, "uninstall", "--timeout", "3m")
    print(f"helm uninstall refused:\n{refused.value}")
    assert f"job {HOOK} failed: BackoffLimitExceeded" in str(refused.value)
    # Helm prints the hook's log where the API server reaches the kubelets (pods/log; not
    # on this local cluster); the pod's termination message says the same.
    message = hook_message(kube)
    assert message.startswith(
        "refusing to uninstall: 1 ResourceClaim(s) hold GPUs of gpu.composable.dra.io: "
        f"{work}/holder (pods holder). Delete those pods"
    ), message
    status = json.loads(helm(cp, "status", "--output", "json"))
    assert status["info"]["status"] == "uninstalling"
    assert kube.get(path("v1", "pods", "holder", namespace=work))["status"]["phase"] == "Running"
    assert kube.get_or_none(orphan) is not None
    assert all(len(running(pods_of(kube, c))) == 1 for c in (*CONTROLLERS, "plugin"))

    # The pod gone, the same command drains and uninstalls.
    delete_pod(kube, work, "holder")
    t0 = time.monotonic()
    helm(cp, "uninstall", "--timeout", "4m")
    uninstalled_s = time.monotonic() - t0
    clean: list[str] = []

    def nothing_left() -> bool:
        node.check_alive()
        clean[:] = leftovers(kube)
        return not clean

    wait_for(
        nothing_left, 120, "nothing of the release left", interval=0.5, describe=lambda: str(clean)
    )
    clean_s = time.monotonic() - t0
    print(f"helm uninstall (hook included): {uninstalled_s:.1f}s; -> nothing left: {clean_s:.1f}s")
    # The operator, still running during the drain, let the resource go (and said so).
    events = kube.get(path("v1", "events"), fieldSelector="reason=FabricGone")["items"]
    assert [e["involvedObject"]["name"] for e in events] == ["orphan-1"]


def static_devices(count: int) -> str:
    """``count`` static GPUs for every node, the chart's default one first (the one
    ``plugin_registered`` looks for)."""
    default = yaml.safe_load((chart.CHART / "values.yaml").read_text())["plugin"]["static"]
    devices = list(default["devices"])
    devices += [
        {**devices[0], "uuid": f"GPU-00000000-life-0000-0000-00000000000{i}"}
        for i in range(1, count)
    ]
    return f"plugin.static.devices={json.dumps(devices)}"


def rolled(kube: Kube, old_plugin: str, old_leaders: dict[str, str]) -> dict[str, str] | None:
    """The new leaders by component, once the roll is over: the plugin DaemonSet and each
    Deployment updated and available with none of their old pods left, and each Lease held
    by a new pod."""
    ds = kube.get(
        path("apps/v1", "daemonsets", f"{RELEASE}-composable-dra-plugin", namespace=NAMESPACE)
    )
    s = ds["status"]
    want = s.get("desiredNumberScheduled", -1)
    if not want == s.get("updatedNumberScheduled") == s.get("numberAvailable"):
        return None
    plugins = pods_of(kube, "plugin")
    if len(plugins) != want or any(p["metadata"]["uid"] == old_plugin for p in plugins):
        return None
    for component in CONTROLLERS:
        name = f"{RELEASE}-composable-dra-{component}"
        d = kube.get(path("apps/v1", "deployments", name, namespace=NAMESPACE))
        s, replicas = d["status"], d["spec"]["replicas"]
        if (
            not replicas
            == s.get("updatedReplicas")
            == s.get("availableReplicas")
            == s.get("replicas")
        ):
            return None
    held = leaders(kube)
    new = {c: pod for c, pod in held.items() if pod not in old_leaders.values()}
    return new if len(new) == len(CONTROLLERS) else None


def kubelet_lines(node: RealNode, *needles: str) -> list[str]:
    log = (node.logs_dir / "kubelet.log").read_text(errors="replace")
    return [line for line in log.splitlines() if any(n in line for n in needles)]


# Long because it is one scenario read top to bottom: install, roll, check, uninstall.
def test_helm_upgrade_rolls_the_plugin_seamlessly_and_hands_leadership_over(
    node: RealNode, sa_control_plane: ControlPlane, work: str
) -> None:
    cp = sa_control_plane
    kube, image, old_leaders = installed(cp, node, "--set-json", static_devices(3))
    (old_plugin,) = running(pods_of(kube, "plugin"))
    old_uid = old_plugin["metadata"]["uid"]
    holder = gpu_pod(kube, node, work, "holder")
    wait_running(kube, node, work, "holder")

    # The same image under a second tag, as a release's next image would be imported.
    repository = image.ref.rpartition(":")[0]
    second = f"{image.tag}-next"
    node.ctr("images", "tag", image.ref, f"{repository}:{second}")
    t0 = time.monotonic()
    helm(cp, "upgrade", str(chart.CHART), "--reuse-values", "--set", f"image.tag={second}")
    # Pods started one after another all through the roll: each is prepared and runs.
    started: list[str] = []
    new_leaders = None
    while new_leaders is None:
        name = f"roll-{len(started)}"
        gpu_pod(kube, node, work, name)
        wait_running(kube, node, work, name)
        started.append(name)
        delete_pod(kube, work, name)
        new_leaders = rolled(kube, old_uid, old_leaders)
        assert time.monotonic() - t0 < 180, "the roll did not end within 3 minutes"
    rolled_s = time.monotonic() - t0
    (new_plugin,) = running(pods_of(kube, "plugin"))
    new_uid = new_plugin["metadata"]["uid"]
    gpu_pod(kube, node, work, "after")
    wait_running(kube, node, work, "after")
    print(
        f"helm upgrade -> roll complete (plugin, 3 Deployments, 3 Leases): {rolled_s:.1f}s; "
        f"{len(started)} pods started during the roll; leaders {old_leaders} -> {new_leaders}"
    )

    # The kubelet registered both pods' sockets, and the new pod prepares.
    registrations = kubelet_lines(node, f"{old_uid}-reg.sock", f"{new_uid}-reg.sock")
    print("\n".join(registrations[-6:]))
    assert any(old_uid in line for line in registrations)
    assert any(new_uid in line for line in registrations)
    # The old pod went only after the kubelet had registered the new one (the probes'
    # health says serving once registered): no prepare found the old socket gone.
    new_registered = next(
        i
        for i, line in enumerate(registrations)
        if "RegisterPlugin started" in line and new_uid in line
    )
    old_removed = next(
        i
        for i, line in enumerate(registrations)
        if "Removing socket path" in line and old_uid in line
    )
    assert new_registered < old_removed, "\n".join(registrations)
    new_log = node.container_log(NAMESPACE, new_plugin["metadata"]["name"], "plugin")
    assert "registered with the kubelet" in new_log
    assert f'"claim": "{work}/after"' in new_log or f'"claim":"{work}/after"' in new_log, new_log[
        -2000:
    ]
    assert new_plugin["spec"]["containers"][0]["image"] == f"{repository}:{second}"

    # The pod that held its GPU all along runs on, never restarted; no prepare failed.
    got = kube.get(path("v1", "pods", "holder", namespace=work))
    assert got["metadata"]["uid"] == holder["metadata"]["uid"]
    assert got["status"]["phase"] == "Running"
    assert got["status"]["containerStatuses"][0]["restartCount"] == 0
    events = kube.get(path("v1", "events", namespace=work))["items"]
    warnings = [f"{e['reason']}: {e['message']}" for e in events if e.get("type") == "Warning"]
    assert not warnings, warnings

    for name in ("holder", "after"):
        delete_pod(kube, work, name)
    t1 = time.monotonic()
    helm(cp, "uninstall", "--timeout", "4m")
    wait_for(lambda: not leftovers(kube), 120, "nothing of the release left", interval=0.5)
    print(f"helm uninstall -> nothing left: {time.monotonic() - t1:.1f}s")


def apply_crds(kube: Kube, directory: Path) -> None:
    """The documented step before `helm upgrade`: `kubectl apply --server-side
    --force-conflicts -f <chart>/crds/`, as the request kubectl makes (server-side apply,
    field manager kubectl, conflicts forced), then each CRD established."""
    crds = "apiextensions.k8s.io/v1"
    for manifest in sorted(directory.glob("*.yaml")):
        crd = yaml.safe_load(manifest.read_text())
        where = path(crds, "customresourcedefinitions", crd["metadata"]["name"])
        kube.apply(where, crd, "kubectl", force=True)

        def established(where: str = where) -> bool:
            conditions = kube.get(where).get("status", {}).get("conditions", [])
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, 30, f"{manifest.name} established", interval=0.2)


def test_crds_change_by_the_documented_step_never_by_helm_upgrade(
    sa_control_plane: ControlPlane, tmp_path: Path
) -> None:
    """No node: the CRDs are the API server's business only (the chart's pods stay
    Pending, and the release goes with --no-hooks, whose Jobs could not run)."""
    cp = sa_control_plane
    kube = admin(cp)
    install(cp, find_product_image())
    # The chart's next version: a new optional field in a CRD of its crds/.
    upgraded = tmp_path / "composable-dra"
    shutil.copytree(chart.CHART, upgraded)
    changed = upgraded / "crds" / "composable.dra.io_composabilityrequests.yaml"
    crd = yaml.safe_load(changed.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["note"] = {"type": "string", "maxLength": 256}
    changed.write_text(yaml.safe_dump(crd, sort_keys=False))
    requests = path(CR, "composabilityrequests")
    body: JSON = {
        "apiVersion": CR,
        "kind": "ComposabilityRequest",
        "metadata": {"name": "noted"},
        "spec": {"fabric": "f", "model": "A100", "size": 0, "note": "from the next chart"},
    }

    def create() -> JSON:
        return kube.request("POST", requests, body=body, query={"fieldValidation": "Strict"})

    helm(cp, "upgrade", str(upgraded), "--reuse-values")
    with pytest.raises(KubeError, match=re.escape('unknown field "spec.note"')):
        create()  # helm upgrade left the CRD as it was
    t0 = time.monotonic()
    apply_crds(kube, upgraded / "crds")
    created = wait_for(create, 30, "the new field to be accepted", interval=0.2)
    print(f"CRDs applied -> the new field accepted: {time.monotonic() - t0:.1f}s")
    assert created["spec"]["note"] == "from the next chart"
    assert (
        kube.get(path(CR, "composabilityrequests", "noted"))["spec"]["note"] == body["spec"]["note"]
    )

    kube.delete(path(CR, "composabilityrequests", "noted"))
    apply_crds(kube, chart.CHART / "crds")  # the file's other tests see the chart's own
    helm(cp, "uninstall", "--no-hooks")
