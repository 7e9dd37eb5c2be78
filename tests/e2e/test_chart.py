"""The Helm chart on the real API server: dry-run apply, RBAC by SubjectAccessReview, and
the ValidatingAdmissionPolicy that keeps each plugin to its own node, by impersonation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from composable_dra.k8s.kube import JSON, Conflict, Kube, KubeError, path
from composable_dra.model import names
from testbed import ControlPlane, chart
from testbed.crds import install_crds
from testbed.wait import wait_for

pytestmark = pytest.mark.e2e

VALUE_SETS: dict[str, list[Path]] = {
    "default": [],
    "all-enabled": [chart.CHART / "ci" / "all-enabled-values.yaml"],
    "kind": [chart.ROOT / "hack" / "kind" / "values.yaml"],
}
MANAGER = "composable-dra-chart-test"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


# -- helpers ------------------------------------------------------------------------------


class Resources:
    """Where an object of (apiVersion, kind) lives, from the server's discovery."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._known: dict[tuple[str, str], tuple[str, bool]] = {}

    def url(self, obj: JSON, default_namespace: str) -> str:
        api_version, kind = obj["apiVersion"], obj["kind"]
        if (api_version, kind) not in self._known:
            base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            for r in self.kube.get(base)["resources"]:
                if "/" not in r["name"]:
                    self._known[(api_version, r["kind"])] = (r["name"], r["namespaced"])
        plural, namespaced = self._known[(api_version, kind)]
        ns = obj["metadata"].get("namespace", default_namespace) if namespaced else None
        return path(api_version, plural, obj["metadata"]["name"], namespace=ns)

    def apply(self, obj: JSON, namespace: str, dry_run: bool = False) -> JSON:
        query: dict[str, Any] = {"fieldManager": MANAGER, "force": True}
        if dry_run:
            query["dryRun"] = "All"
        return self.kube.request(
            "PATCH",
            self.url(obj, namespace),
            body=obj,
            query=query,
            content_type="application/apply-patch+yaml",
        )


# The Prometheus Operator's kinds the chart renders (monitoring.coreos.com/v1): plural.
MONITORING_KINDS = {"ServiceMonitor": "servicemonitors", "PrometheusRule": "prometheusrules"}


def install_monitoring_crd(kube: Kube, kind: str) -> None:
    """A stand-in for one of the Prometheus Operator's CRDs (schema left open)."""
    plural = MONITORING_KINDS[kind]
    crd: JSON = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    crd_path = path("apiextensions.k8s.io/v1", "customresourcedefinitions", crd["metadata"]["name"])
    with contextlib.suppress(Conflict):
        kube.create(path("apiextensions.k8s.io/v1", "customresourcedefinitions"), crd)

    def established() -> bool:
        conditions = kube.get(crd_path).get("status", {}).get("conditions", [])
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, 30, f"the {kind} CRD to be established")


@pytest.fixture(scope="module")
def chart_crds(kube_json: Kube) -> list[str]:
    """The chart's CRDs, installed for real.

    They equal deploy/crds: tests/unit/deploy/test_chart.py."""
    return install_crds(kube_json, chart.CHART / "crds")


@dataclass
class Release:
    """Objects created for real for one test, deleted afterwards (cluster-scoped ones too)."""

    resources: Resources
    namespace: str

    def __post_init__(self) -> None:
        self.created: list[str] = []

    def create(self, obj: JSON) -> JSON:
        out = self.resources.apply(obj, self.namespace)
        self.created.append(self.resources.url(obj, self.namespace))
        return out

    def cleanup(self) -> None:
        for url in reversed(self.created):
            self.resources.kube.delete(url)


@pytest.fixture
def release(kube_json: Kube, namespace: str) -> Iterator[Release]:
    rel = Release(Resources(kube_json), namespace)
    yield rel
    rel.cleanup()


def impersonating(cp: ControlPlane, user: str, node: str | None) -> Kube:
    """A client that acts as ``user``, with the node-name extra a bound token carries."""
    api = cp.api_client()
    api.set_default_header("Impersonate-User", user)
    if node is not None:
        api.set_default_header("Impersonate-Extra-" + NODE_NAME_KEY.replace("/", "%2f"), node)
    return Kube(api)


# -- dry run --------------------------------------------------------------------------------


@pytest.mark.versions("1.35", "1.36")
@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_rendered_chart_passes_server_side_dry_run(
    value_set: str, kube_json: Kube, chart_crds: list[str], namespace: str, unique: str
) -> None:
    objs = chart.render(
        release=f"r{unique}",
        namespace=namespace,
        values_files=VALUE_SETS[value_set],
        # The namespaces a Role is rendered into must exist, even for a dry run.
        values={"credentialsNamespaces": [namespace]},
    )
    for kind in sorted({o["kind"] for o in objs} & set(MONITORING_KINDS)):
        install_monitoring_crd(kube_json, kind)
    resources = Resources(kube_json)
    # Other tests share the control plane: only what did not exist may not appear.
    absent = [o for o in objs if kube_json.get_or_none(resources.url(o, namespace)) is None]
    refused = []
    for obj in objs:
        try:
            out = resources.apply(obj, namespace, dry_run=True)
        except KubeError as exc:
            refused.append(f"{obj['kind']} {obj['metadata']['name']}: {exc}")
            continue
        assert out["kind"] == obj["kind"]
        assert out["metadata"]["name"] == obj["metadata"]["name"]
    assert not refused, "\n".join(refused)
    # A dry run creates nothing.
    assert len(absent) > len(objs) // 2  # the check below is not vacuous
    for obj in absent:
        assert kube_json.get_or_none(resources.url(obj, namespace)) is None


def test_dry_run_refuses_a_broken_object(kube_json: Kube, namespace: str, unique: str) -> None:
    """The dry run above checks something: the server refuses a bad CEL selector."""
    dc = next(o for o in chart.render(release=f"r{unique}") if o["kind"] == "DeviceClass")
    dc["metadata"]["name"] = f"broken-{unique}"
    dc["spec"]["selectors"][0]["cel"]["expression"] = "device.driver =="
    with pytest.raises(KubeError) as err:
        Resources(kube_json).apply(dc, namespace, dry_run=True)
    assert err.value.status == 422


# -- RBAC -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    namespace: str = ""  # "" = cluster-wide; "@" = the release namespace
    name: str = ""

    def attributes(self, release_ns: str) -> JSON:
        ns = release_ns if self.namespace == "@" else self.namespace
        attrs = {"verb": self.verb, "group": self.group, "resource": self.resource}
        for key, value in (
            ("subresource", self.subresource),
            ("namespace", ns),
            ("name", self.name),
        ):
            if value:
                attrs[key] = value
        return attrs

    def __str__(self) -> str:
        res = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        where = f" in {self.namespace}" if self.namespace else ""
        return (
            f"{self.verb} {self.group or 'core'}:{res}{' ' + self.name if self.name else ''}{where}"
        )


G = "composable.dra.io"
R = "resource.k8s.io"
D = names.DRIVER
LEASE = "composable-dra-scaler"


def no_secrets_nor_leases(namespace: str) -> list[Access]:
    """Reading ``namespace``'s secrets, listing any, or taking its leases: refused."""
    return [
        Access("get", "secrets", namespace=namespace),
        Access("list", "secrets"),
        Access("update", "leases", "coordination.k8s.io", namespace=namespace),
    ]


# component -> (what it must be able to do, what it must not).
EXPECTED: dict[str, tuple[list[Access], list[Access]]] = {
    "plugin": (
        [
            Access("get", "nodes"),
            Access("create", "resourceslices", R),
            Access("patch", "resourceslices", R),
            Access("delete", "resourceslices", R),
            Access("watch", "resourceslices", R),
            Access("get", "resourceclaims", R, namespace="team-a"),
            Access("patch", "resourceclaims", R, "status", namespace="team-a"),
            Access("associated-node:patch", "resourceclaims", R, "driver", "team-a", D),
            Access("patch", "composableresources", G, "status"),
            Access("list", "composableresources", G),
            Access("create", "events", namespace="team-a"),
        ],
        [
            Access("delete", "nodes"),
            Access("patch", "nodes"),
            Access("create", "fabrics", G),
            Access("patch", "fabrics", G),
            Access("update", "fabrics", G, "status"),
            Access("create", "composableresources", G),
            Access("patch", "composableresources", G),
            Access("arbitrary-node:patch", "resourceclaims", R, "driver", "team-a", D),
            Access("associated-node:patch", "resourceclaims", R, "driver", "team-a", "other.dev"),
            Access("update", "resourceclaims", R, namespace="team-a"),
            Access("create", "devicetaintrules", R),
            *no_secrets_nor_leases("@"),
        ],
    ),
    "pool-publisher": (
        [
            Access("create", "resourceslices", R),
            Access("delete", "resourceslices", R),
            Access("list", "fabrics", G),
            Access("watch", "nodes"),
            Access("patch", "nodes"),  # its own zone labels (poolPublisher.labelNodes)
            Access("get", "secrets", namespace="@"),
            Access("update", "leases", "coordination.k8s.io", namespace="@"),
        ],
        [
            # An apply to a Node that is gone must not make one.
            Access("create", "nodes"),
            Access("update", "nodes"),
            Access("delete", "nodes"),
            Access("patch", "nodes", subresource="status"),
            Access("update", "fabrics", G, "status"),
            Access("create", "composableresources", G),
            Access("patch", "resourceclaims", R, "status", namespace="team-a"),
            # Without extendedResource no class to touch (the next test has one).
            Access("patch", "deviceclasses", R, name="composable-gpu-extended"),
            *no_secrets_nor_leases("kube-system"),
        ],
    ),
    "scaler": (
        [
            Access("create", "composableresources", G),
            Access("delete", "composableresources", G),
            Access("patch", "composabilityrequests", G),
            Access("watch", "resourceclaims", R),
            Access("update", "resourceclaims", R, "status", namespace="team-a"),
            Access("patch", "resourceclaims", R, "status", namespace="team-a"),
            Access("arbitrary-node:update", "resourceclaims", R, "driver", "team-a", D),
            Access("arbitrary-node:patch", "resourceclaims", R, "driver", "team-a", D),
            Access("list", "pods"),
            Access("get", "leases", "coordination.k8s.io", namespace="@"),
            Access("create", "leases", "coordination.k8s.io", namespace="@"),
            Access("update", "leases", "coordination.k8s.io", namespace="@"),
            Access("create", "events", namespace="team-a"),
            # Quarantine of a pool device whose attach failed (NoSchedule taint rule).
            Access("create", "devicetaintrules", R),
            Access("watch", "devicetaintrules", R),
            Access("delete", "devicetaintrules", R),
        ],
        [
            Access("update", "composableresources", G, "status"),
            Access("update", "fabrics", G, "status"),
            Access("create", "resourceslices", R),
            Access("arbitrary-node:update", "resourceclaims", R, "driver", "team-a", "other.dev"),
            Access("update", "resourceclaims", R, "binding", namespace="team-a"),
            Access("delete", "nodes"),
            Access("delete", "pods", namespace="team-a"),
            Access("get", "secrets", namespace="@"),
            Access("list", "secrets"),
            Access("update", "leases", "coordination.k8s.io", namespace="kube-system"),
        ],
    ),
    "operator": (
        [
            Access("update", "composableresources", G, "status"),
            Access("patch", "composableresources", G, "status"),
            Access("patch", "composableresources", G),  # the detach finalizer
            Access("create", "composableresources", G),  # requests and adopted orphans
            Access("delete", "composableresources", G),
            Access("update", "fabrics", G, "status"),
            Access("update", "composabilityrequests", G, "status"),
            Access("create", "devicetaintrules", R),
            Access("delete", "devicetaintrules", R),
            Access("list", "resourceclaims", R),
            Access("get", "secrets", namespace="@"),
            Access("update", "leases", "coordination.k8s.io", namespace="@"),
            Access("create", "events", namespace="@"),
        ],
        [
            Access("create", "fabrics", G),
            Access("create", "resourceslices", R),
            Access("patch", "resourceclaims", R, "status", namespace="team-a"),
            Access("arbitrary-node:patch", "resourceclaims", R, "driver", "team-a", D),
            Access("get", "secrets", namespace="kube-system"),
            Access("list", "secrets"),
            Access("delete", "nodes"),
        ],
    ),
    # helm uninstall's pre-delete hook (it exists only while the hook runs).
    "uninstall-drain": (
        [
            Access("list", "resourceclaims", R),
            Access("list", "composabilityrequests", G),
            Access("delete", "composabilityrequests", G),
            Access("list", "composableresources", G),
            Access("delete", "composableresources", G),
            Access("list", "fabrics", G),
            Access("delete", "fabrics", G),
            Access("patch", "fabrics", G),
            # post-delete: the controllers' Leases, by name
            Access("delete", "leases", "coordination.k8s.io", namespace="@", name=LEASE),
        ],
        [
            Access("delete", "leases", "coordination.k8s.io", namespace="@", name="other"),
            Access("delete", "leases", "coordination.k8s.io", namespace="kube-system", name=LEASE),
            Access("get", "resourceclaims", R, namespace="team-a"),
            Access("delete", "resourceclaims", R, namespace="team-a"),
            Access("delete", "pods", namespace="team-a"),
            Access("create", "composableresources", G),
            Access("patch", "composableresources", G),  # no finalizer removed by hand
            Access("update", "composableresources", G, "status"),
            Access("create", "fabrics", G),
            Access("update", "fabrics", G, "status"),
            Access("delete", "resourceslices", R),
            Access("delete", "customresourcedefinitions", "apiextensions.k8s.io"),
            *no_secrets_nor_leases("@"),
        ],
    ),
}


def allowed(kube: Kube, user: str, groups: list[str], attrs: JSON) -> bool:
    review = kube.create(
        path("authorization.k8s.io/v1", "subjectaccessreviews"),
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attrs},
        },
    )
    return bool(review["status"].get("allowed"))


def wrong_access(
    kube: Kube, namespace: str, rel: str, expected: dict[str, tuple[list[Access], list[Access]]]
) -> list[str]:
    """What each component's service account of release ``rel`` may do and should not, or
    may not and should (SubjectAccessReviews)."""
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    groups.append("system:authenticated")
    wrong = []
    for component, (can, cannot) in expected.items():
        user = f"system:serviceaccount:{namespace}:{rel}-composable-dra-{component}"
        for access, want in [(a, True) for a in can] + [(a, False) for a in cannot]:
            if allowed(kube, user, groups, access.attributes(namespace)) != want:
                wrong.append(f"{component} {'cannot' if want else 'can'} {access}")
    return wrong


def test_each_service_account_can_do_what_it_needs_and_nothing_else(
    kube_json: Kube, release: Release, namespace: str, unique: str
) -> None:
    rel = f"r{unique}"
    objs = chart.render(release=rel, namespace=namespace)
    for obj in objs:
        if obj["kind"] in RBAC_KINDS:
            release.create(obj)
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
    groups.append("system:authenticated")
    wrong = wrong_access(kube_json, namespace, rel, EXPECTED)
    assert not wrong, "\n".join(wrong)

    # The same reviews answer differently for an account the chart did not bind.
    stranger = f"system:serviceaccount:{namespace}:stranger"
    assert not allowed(kube_json, stranger, groups, EXPECTED["scaler"][0][0].attributes(namespace))


def test_the_pool_publisher_touches_only_our_extended_resource_class(
    kube_json: Kube, release: Release, namespace: str, unique: str
) -> None:
    """With extendedResource, the publisher may patch our extended-resource class (after a
    clash ended, class_clash.to_refresh) and no other class, nor create or delete one."""
    rel = f"r{unique}"
    values = {"extendedResource": {"name": "nvidia.com/gpu"}}
    for obj in chart.render(release=rel, namespace=namespace, values=values):
        if obj["kind"] in RBAC_KINDS:
            release.create(obj)
    expected = {
        "pool-publisher": (
            [Access("patch", "deviceclasses", R, name="composable-gpu-extended")],
            [
                Access("patch", "deviceclasses", R, name="gpu.nvidia.com"),
                Access("patch", "deviceclasses", R, name=names.DEVICE_CLASS),
                Access("create", "deviceclasses", R),
                Access("delete", "deviceclasses", R, name="composable-gpu-extended"),
            ],
        )
    }
    wrong = wrong_access(kube_json, namespace, rel, expected)
    assert not wrong, "\n".join(wrong)


def test_without_label_nodes_the_pool_publisher_writes_no_node(
    kube_json: Kube, release: Release, namespace: str, unique: str
) -> None:
    """poolPublisher.labelNodes false: no write to Nodes at all (it only reads them)."""
    rel = f"r{unique}"
    values = {"poolPublisher": {"labelNodes": False}}
    for obj in chart.render(release=rel, namespace=namespace, values=values):
        if obj["kind"] in RBAC_KINDS:
            release.create(obj)
    expected = {
        "pool-publisher": (
            [Access("watch", "nodes"), Access("create", "resourceslices", R)],
            [Access("patch", "nodes"), Access("update", "nodes"), Access("create", "nodes")],
        )
    }
    wrong = wrong_access(kube_json, namespace, rel, expected)
    assert not wrong, "\n".join(wrong)


def test_the_scaler_deletes_pods_only_in_the_vendor_plugins_namespace(
    kube_json: Kube, release: Release, namespace: str, unique: str
) -> None:
    """Vendor-driver mode's plugin restarts: pod deletion in vendorPluginNamespace only."""
    rel, vendor_ns = f"r{unique}", f"v{unique}"
    kube_json.create(path("v1", "namespaces"), {"metadata": {"name": vendor_ns}})
    try:
        objs = chart.render(
            release=rel,
            namespace=namespace,
            values={"vendorDrivers": ["gpu.nvidia.com"], "vendorPluginNamespace": vendor_ns},
        )
        for obj in objs:
            if obj["kind"] in RBAC_KINDS:
                release.create(obj)
        expected = {
            "scaler": (
                [
                    Access("delete", "pods", namespace=vendor_ns),
                    Access("list", "pods", namespace=vendor_ns),
                    Access("patch", "resourceclaims", R, "status", namespace="team-a"),
                    Access(
                        "arbitrary-node:patch",
                        "resourceclaims",
                        R,
                        "driver",
                        "team-a",
                        "gpu.nvidia.com",
                    ),
                ],
                [
                    Access("delete", "pods"),
                    Access("delete", "pods", namespace="@"),
                    Access("delete", "pods", namespace="kube-system"),
                    Access("deletecollection", "pods", namespace=vendor_ns),
                    Access("create", "pods", namespace=vendor_ns),
                    Access("patch", "pods", namespace=vendor_ns),
                ],
            ),
            "operator": ([], [Access("delete", "pods", namespace=vendor_ns)]),
            "plugin": ([], [Access("delete", "pods", namespace=vendor_ns)]),
        }
        wrong = wrong_access(kube_json, namespace, rel, expected)
        assert not wrong, "\n".join(wrong)
    finally:
        release.cleanup()
        release.created.clear()
        kube_json.delete(path("v1", "namespaces", vendor_ns))


# -- the admission policy --------------------------------------------------------------------


def slice_body(name: str, node: str) -> JSON:
    return _slice(name, node, {"nodeName": node}, [{"name": "gpu-0"}])


def lend_slice_body(name: str, pool: str, local_node: str) -> JSON:
    """A lending pool's device slice: a local device on ``local_node`` and a lent one."""
    term = {"matchExpressions": [{"key": "example.com/x", "operator": "In", "values": ["y"]}]}
    devices: list[JSON] = [
        {"name": "gpu-0", "nodeName": local_node},
        {"name": "gpu-0-remote", "nodeSelector": {"nodeSelectorTerms": [term]}},
    ]
    return _slice(name, pool, {"perDeviceNodeSelection": True}, devices)


def _slice(name: str, pool: str, where: JSON, devices: list[JSON]) -> JSON:
    """A one-slice pool ``pool`` of our driver; ``where``: the nodes it is for."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": names.DRIVER,
            **where,
            "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def create_policy(release: Release, rel: str, component: str, policy: str) -> str:
    """The chart's (release ``rel``) ServiceAccount and RBAC of ``component`` and its
    admission policy named ``*policy``, created; the ServiceAccount's user name."""
    objs = chart.render(release=rel, namespace=release.namespace)
    account = f"{rel}-composable-dra-{component}"
    for obj in objs:
        name = str(obj["metadata"]["name"])
        if (obj["kind"] in RBAC_KINDS and name == account) or (
            obj["kind"].startswith("ValidatingAdmissionPolicy") and name.endswith(policy)
        ):
            release.create(obj)
    return f"system:serviceaccount:{release.namespace}:{account}"


def refused(action: Callable[[], object], message: str) -> KubeError:
    with pytest.raises(KubeError) as err:
        action()
    assert err.value.status == 403, err.value
    assert message in err.value.message, err.value.message
    return err.value


# Long because it is one scenario read top to bottom; its steps share what it built.
def test_admission_policy_keeps_the_plugin_to_its_own_node(
    control_plane: ControlPlane,
    kube_json: Kube,
    chart_crds: list[str],
    release: Release,
    namespace: str,
    unique: str,
) -> None:
    rel = f"r{unique}"
    user = create_policy(release, rel, "plugin", "-own-node")
    node_a, node_b = f"node-a-{unique}", f"node-b-{unique}"
    plugin_a = impersonating(control_plane, user, node_a)
    slices = path("resource.k8s.io/v1", "resourceslices")
    foreign = slice_body(f"{node_b}-gpu", node_b)

    # The policy takes effect a moment after it is created: until the plugin's write of a
    # foreign slice is refused, undo any that got through.
    def foreign_write_refused() -> bool:
        try:
            plugin_a.create(slices, foreign)
        except KubeError as exc:
            if exc.status == 403 and "may write only" in exc.message:
                return True
            raise
        kube_json.delete(path("resource.k8s.io/v1", "resourceslices", foreign["metadata"]["name"]))
        return False

    wait_for(foreign_write_refused, 30, "the admission policy to refuse a foreign slice")
    err = refused(lambda: plugin_a.create(slices, foreign), "may write only")
    assert f"spec.nodeName={node_a}, not spec.nodeName={node_b}" in err.message
    assert rel in err.message  # the policy's name is in the denial

    # Its own node's slice: create, update and delete are allowed.
    own_name = f"{node_a}-gpu"
    release.created.append(path("resource.k8s.io/v1", "resourceslices", own_name))
    own = plugin_a.create(slices, slice_body(own_name, node_a))
    assert own["spec"]["nodeName"] == node_a
    own_path = path("resource.k8s.io/v1", "resourceslices", own_name)
    plugin_a.merge_patch(own_path, {"metadata": {"labels": {"touched": "yes"}}})
    plugin_a.delete(own_path)
    assert kube_json.get_or_none(own_path) is None

    # A lending node's slices: per-device node selection, its own pool, devices on it or
    # lent by a node selector. Another pool, or a device placed on another node: refused.
    lend_name = f"{node_a}-lend"
    release.created.append(path("resource.k8s.io/v1", "resourceslices", lend_name))
    plugin_a.create(slices, lend_slice_body(lend_name, node_a, node_a))
    plugin_a.delete(path("resource.k8s.io/v1", "resourceslices", lend_name))
    refused(
        lambda: plugin_a.create(slices, lend_slice_body(f"{node_b}-lend", node_b, node_b)),
        "may write only",
    )
    refused(
        lambda: plugin_a.create(slices, lend_slice_body(f"{node_a}-lend2", node_a, node_b)),
        "may write only",
    )

    # Another node's slice made by someone else: the plugin may neither change nor delete it.
    release.create(foreign)
    foreign_path = path("resource.k8s.io/v1", "resourceslices", foreign["metadata"]["name"])
    refused(
        lambda: plugin_a.merge_patch(foreign_path, {"metadata": {"labels": {"x": "y"}}}),
        "may write only",
    )
    refused(lambda: plugin_a.delete(foreign_path), "may not change an object of node " + node_b)
    assert kube_json.get_or_none(foreign_path) is not None

    # Credentials without a node name (not a pod-bound token): refused outright.
    anonymous_node = impersonating(control_plane, user, None)
    refused(
        lambda: anonymous_node.create(slices, slice_body(f"{node_a}-x", node_a)), "name no node"
    )

    # ComposableResource status: only of resources targeting its node.
    crs = {}
    for node in (node_a, node_b):
        crs[node] = release.create(
            {
                "apiVersion": f"{G}/v1alpha1",
                "kind": "ComposableResource",
                "metadata": {"name": f"cr-{node}"},
                "spec": {"fabric": "f1", "deviceID": "gpu-1", "targetNode": node},
            }
        )
    visible = {
        "status": {
            "conditions": [
                {
                    "type": names.DEVICE_VISIBLE,
                    "status": "True",
                    "reason": "Found",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
    }

    def cr_status(node: str) -> str:
        return path(f"{G}/v1alpha1", "composableresources", f"cr-{node}", subresource="status")

    out = plugin_a.merge_patch(cr_status(node_a), visible)
    assert out["status"]["conditions"][0]["type"] == names.DEVICE_VISIBLE
    refused(
        lambda: plugin_a.merge_patch(cr_status(node_b), visible),
        f"spec.targetNode={node_a}, not spec.targetNode={node_b}",
    )

    # The policy binds only the plugin: the admin wrote node-b's slice above, and another
    # service account with the same node name is not subject to it (RBAC stops it instead).
    other = impersonating(control_plane, f"system:serviceaccount:{namespace}:other", node_a)
    with pytest.raises(KubeError) as rbac:
        other.create(slices, foreign)
    assert rbac.value.status == 403 and "may write only" not in rbac.value.message


def test_admission_policy_keeps_the_pool_publisher_to_its_zone_labels(
    control_plane: ControlPlane, kube_json: Kube, release: Release, namespace: str, unique: str
) -> None:
    """RBAC lets the publisher patch any field of any Node; the policy leaves it its own
    zone labels (pool_publisher/node_labels.py) and nothing else."""
    rel = f"r{unique}"
    user = create_policy(release, rel, "pool-publisher", "-zone-labels")
    node = f"zl-{unique}"
    node_path = path("v1", "nodes", node)
    kube_json.create(path("v1", "nodes"), {"metadata": {"name": node, "labels": {"site": "lab"}}})
    release.created.insert(0, node_path)  # deleted last: after the policy
    publisher = impersonating(control_plane, user, None)
    message = "the pool publisher may change only its zone labels"

    def other_label_refused() -> bool:
        try:
            publisher.merge_patch(node_path, {"metadata": {"labels": {"site": "moved"}}})
        except KubeError as exc:
            if exc.status == 403 and message in exc.message:
                return True
            raise
        kube_json.merge_patch(node_path, {"metadata": {"labels": {"site": "lab"}}})
        return False

    # The policy takes effect a moment after it is created.
    policy = path(
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        f"{rel}-composable-dra-pool-publisher-zone-labels",
    )
    wait_for(
        other_label_refused,
        30,
        "the admission policy to refuse another label",
        describe=lambda: str(kube_json.get(policy).get("status")),
    )

    # Its own zone labels: added, changed and removed, by server-side apply as it writes.
    own = "f1.zone.composable.dra.io/z1"
    publisher.apply(
        node_path,
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {own: "true"}}},
        "composable-dra-pool-publisher",
    )
    assert kube_json.get(node_path)["metadata"]["labels"] == {"site": "lab", own: "true"}
    publisher.merge_patch(node_path, {"metadata": {"labels": {own: None}}})
    assert kube_json.get(node_path)["metadata"]["labels"] == {"site": "lab"}

    # Anything else: another label added or removed, the spec, an annotation, a new Node,
    # a deletion.
    refused(lambda: publisher.merge_patch(node_path, {"metadata": {"labels": {"x": "y"}}}), message)
    refused(
        lambda: publisher.merge_patch(node_path, {"metadata": {"labels": {"site": None}}}), message
    )
    refused(lambda: publisher.merge_patch(node_path, {"spec": {"unschedulable": True}}), message)
    refused(
        lambda: publisher.merge_patch(node_path, {"metadata": {"annotations": {"a": "b"}}}), message
    )
    refused(lambda: publisher.delete(node_path), "")
    got = kube_json.get(node_path)
    assert got["metadata"]["labels"] == {"site": "lab"}
    assert not got["spec"].get("unschedulable")
    assert "a" not in got["metadata"].get("annotations", {})


# -- examples ---------------------------------------------------------------------------------

EXAMPLES = ["prefer-local-fallback-pool", "pool-only", "two-gpus", "shared-claim"]


@pytest.mark.versions("1.35", "1.36")
@pytest.mark.parametrize("example", EXAMPLES)
def test_example_passes_server_side_dry_run(example: str, kube_json: Kube, namespace: str) -> None:
    """Each example is valid for the API server (CEL selectors compile, firstAvailable and
    counts are accepted). The pods running on them are the attach flow's end-to-end tests."""
    docs = [
        d
        for d in yaml.safe_load_all(
            (chart.ROOT / "deploy" / "examples" / f"{example}.yaml").read_text()
        )
        if d
    ]
    kinds = [d["kind"] for d in docs]
    assert "Pod" in kinds
    resources = Resources(kube_json)
    for doc in docs:
        assert "namespace" not in doc["metadata"], "examples go into the user's namespace"
        out = resources.apply(doc, namespace, dry_run=True)
        assert out["metadata"]["namespace"] == namespace
        if doc["kind"] in ("ResourceClaim", "ResourceClaimTemplate"):
            spec = out["spec"] if doc["kind"] == "ResourceClaim" else out["spec"]["spec"]
            for request in spec["devices"]["requests"]:
                for sub in request.get("firstAvailable") or [request.get("exactly")]:
                    assert sub["deviceClassName"] in (names.DEVICE_CLASS, names.LOCAL_DEVICE_CLASS)
