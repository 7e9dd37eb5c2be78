"""Lending a GPU: the donor's partitionable pool, enforced by the real kube-scheduler.

Donor A runs the plugin with ``--lend`` (static source, kubelet emulator); borrowers are
plain nodes in the same network domain. Remote claims wait in binding for
``RemoteGPUReady``; the lease controller that sets it is later work, so the tests set it
themselves (``lease_ready``) where a lent claim has to bind, as that controller will. What
the scheduler granted is read from the claims' ``status.allocation``.

Why lent pods are bound before their claims are deleted: a pod still waiting in binding
holds its allocation in the scheduler until the scheduler next polls the claim (5 s), and
that release wakes no waiting pod, so a pod refused meanwhile would wait for the
scheduler's periodic flush of unschedulable pods (minutes). A bound pod's claim is
released by its deallocation, which does wake them.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, path
from composable_dra.model import names
from dra_driver.slices import NETWORK_DOMAIN_LABEL
from testbed import ControlPlane
from testbed.kubelet_emulator import KubeletEmulator
from testbed.nodes import create_node, delete_node
from testbed.objects import create_claim_pod
from testbed.plugin_process import PluginProcess, write_static_devices
from testbed.wait import wait_for
from tests.e2e.test_plugin import gpu

RESOURCE = "resource.k8s.io/v1"
DRIVER = "gpu.composable.dra.io"
CLASS = "composable-gpu"
REMOTE = f'device.attributes["{DRIVER}"].attachment == "remote"'


class Cluster:
    """A donor with the lending plugin, and borrower nodes without GPUs."""

    def __init__(self, kube: Kube, cp: ControlPlane, root: Path, unique: str) -> None:
        self.kube, self.cp, self.root, self.unique = kube, cp, root, unique
        self.domain = f"dom-{unique}"
        self.nodes: list[str] = []
        self.kubelet: KubeletEmulator | None = None
        self.plugin: PluginProcess | None = None

    def node(self, suffix: str) -> str:
        name = f"{suffix}-{self.unique}"
        create_node(self.kube.api, name, labels={NETWORK_DOMAIN_LABEL: self.domain})
        self.nodes.append(name)
        return name

    def donor(self, gpus: int, max_leases: int, fabric: int = 0) -> str:
        name = self.node("donor")
        self.kubelet = KubeletEmulator(self.kube, name, self.root / "kubelet", self.root / "cdi")
        self.kubelet.start()
        self.plugin = PluginProcess.beside(
            self.kubelet,
            name,
            self.cp.kubeconfig,
            self.root / "plugin",
            ["--lend", "--link-gbps=100", f"--max-leases={max_leases}"],
        )
        devices = [gpu(name, i) for i in range(gpus)]
        # GPUs the fabric attached: published as local devices, never lent.
        devices += [{**gpu(name, gpus + i), "attachment": "fabric"} for i in range(fabric)]
        write_static_devices(self.plugin.static_file, devices)
        self.plugin.start()
        plugin = self.plugin
        wait_for(
            lambda: plugin.logged("slices in sync"),
            30,
            "the donor's slices",
            describe=plugin.log_tail,
        )
        return name

    def close(self) -> None:
        if self.plugin is not None:
            assert self.plugin.stop() == 0, self.plugin.log_tail()
        if self.kubelet is not None:
            self.kubelet.stop()
        for name in self.nodes:
            delete_node(self.kube.api, name)


@pytest.fixture
def cluster(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str
) -> Iterator[Cluster]:
    c = Cluster(kube_json, control_plane, short_tmp, unique)
    yield c
    c.close()


def claim_pod(kube: Kube, ns: str, name: str, node: str, remote: bool) -> None:
    request: JSON = {"deviceClassName": CLASS}
    if remote:
        request["selectors"] = [{"cel": {"expression": REMOTE}}]
    create_claim_pod(kube, ns, name, node=node, exactly=request)


def get_claim(kube: Kube, ns: str, name: str) -> JSON | None:
    return kube.get_or_none(path(RESOURCE, "resourceclaims", name, namespace=ns))


def allocated(kube: Kube, ns: str, name: str) -> tuple[str, str] | None:
    """(pool, device) of the claim's allocation, None while unallocated."""
    c = get_claim(kube, ns, name) or {}
    alloc = (c.get("status") or {}).get("allocation")
    if not alloc:
        return None
    (res,) = alloc["devices"]["results"]
    return res["pool"], res["device"]


def wait_allocated(kube: Kube, ns: str, name: str) -> tuple[str, str]:
    return wait_for(
        lambda: allocated(kube, ns, name),
        60,
        f"claim {name} to be allocated",
        describe=lambda: json.dumps(get_claim(kube, ns, name)),
    )


def wait_unschedulable(kube: Kube, ns: str, name: str) -> None:
    """The scheduler tried the pod and found no node: PodScheduled False, Unschedulable."""

    def refused() -> bool:
        p = kube.get_or_none(path("v1", "pods", name, namespace=ns)) or {}
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
            for c in (p.get("status") or {}).get("conditions") or []
        )

    wait_for(refused, 60, f"pod {name} to be found unschedulable")
    assert allocated(kube, ns, name) is None


def lease_ready(kube: Kube, ns: str, name: str) -> None:
    """Stand-in for the lease controller: RemoteGPUReady on the claim's device."""
    c = get_claim(kube, ns, name) or {}
    (res,) = c["status"]["allocation"]["devices"]["results"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.apply(
        path(RESOURCE, "resourceclaims", name, namespace=ns, subresource="status"),
        {
            "apiVersion": RESOURCE,
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns, "uid": c["metadata"]["uid"]},
            "status": {
                "devices": [
                    {
                        "driver": res["driver"],
                        "pool": res["pool"],
                        "device": res["device"],
                        "conditions": [
                            {
                                "type": "RemoteGPUReady",
                                "status": "True",
                                "reason": "LeaseOpen",
                                "message": "set by the test",
                                "lastTransitionTime": now,
                            }
                        ],
                    }
                ]
            },
        },
        "test-lease-controller",
    )


def lend_and_bind(kube: Kube, ns: str, name: str, borrower: str) -> tuple[str, str]:
    """A remote claim's pod on ``borrower``: allocated, held in binding until ready, bound."""
    claim_pod(kube, ns, name, borrower, remote=True)
    granted = wait_allocated(kube, ns, name)
    pod = kube.get(path("v1", "pods", name, namespace=ns))
    # bindingConditions: no binding before RemoteGPUReady.
    assert not pod["spec"].get("nodeName"), pod
    lease_ready(kube, ns, name)
    wait_for(
        lambda: (
            kube.get(path("v1", "pods", name, namespace=ns))["spec"].get("nodeName") == borrower
        ),
        60,
        f"pod {name} to bind once its lease is ready",
    )
    return granted


def delete_pod_and_claim(kube: Kube, ns: str, name: str) -> None:
    # No kubelet runs on a borrower here to confirm a graceful deletion.
    kube.delete(path("v1", "pods", name, namespace=ns), gracePeriodSeconds=0)
    kube.delete(path(RESOURCE, "resourceclaims", name, namespace=ns))
    wait_for(lambda: get_claim(kube, ns, name) is None, 60, f"claim {name} to go")


@pytest.mark.versions("1.36", gated=("1.35",))
def test_donor_publishes_remote_devices_with_counters(
    kube_json: Kube, cluster: Cluster, device_class: str
) -> None:
    donor = cluster.donor(gpus=2, max_leases=3)
    items = kube_json.get(path(RESOURCE, "resourceslices"), fieldSelector=f"spec.driver={DRIVER}")[
        "items"
    ]
    pool = [s for s in items if s["spec"]["pool"]["name"] == donor]
    counters = {
        c["name"]: c["counters"] for s in pool for c in s["spec"].get("sharedCounters") or []
    }
    assert counters == {
        "link": {"leases": {"value": "3"}},
        "gpu-0": {"gpu": {"value": "1"}},
        "gpu-1": {"gpu": {"value": "1"}},
    }
    devices = {d["name"]: d for s in pool for d in s["spec"].get("devices") or []}
    assert set(devices) == {"gpu-0", "gpu-1", "gpu-0-remote", "gpu-1-remote"}
    remote = devices["gpu-0-remote"]
    assert remote["attributes"]["attachment"] == {"string": "remote"}
    assert remote["attributes"]["donorNode"] == {"string": donor}
    assert remote["bindingConditions"] == ["RemoteGPUReady"]
    assert devices["gpu-0"]["nodeName"] == donor

    # A new GPU: one rewrite of the pool at the next generation, and no rewrite loop
    # (the plugin finds its per-device slices, which have no spec.nodeName, by label).
    generation = pool[0]["spec"]["pool"]["generation"]
    assert cluster.plugin is not None
    write_static_devices(cluster.plugin.static_file, [gpu(donor, i) for i in range(3)])

    def grown() -> list[JSON] | None:
        items = kube_json.get(
            path(RESOURCE, "resourceslices"), labelSelector=f"composable.dra.io/pool-node={donor}"
        )["items"]
        names = {d["name"] for s in items for d in s["spec"].get("devices") or []}
        return items if "gpu-2-remote" in names else None

    after = wait_for(grown, 30, "the third GPU to be lent")
    assert {s["spec"]["pool"]["generation"] for s in after} == {generation + 1}
    plugin = cluster.plugin

    def published() -> list[JSON]:
        return [e for e in plugin.process.log_events() if e.get("event") == "slices published"]

    # The line follows the write that the slices above show: wait for it, then no more.
    wait_for(lambda: len(published()) >= 2, 10, "the plugin's second 'slices published'")
    assert len(published()) == 2, published()


@pytest.mark.versions("1.36", gated=("1.35",))
def test_one_gpu_is_never_local_and_remote_at_once(
    kube_json: Kube, cluster: Cluster, device_class: str, namespace: str
) -> None:
    donor = cluster.donor(gpus=1, max_leases=2)
    borrower = cluster.node("borrower")
    assert lend_and_bind(kube_json, namespace, "lent", borrower) == (donor, "gpu-0-remote")
    lent = get_claim(kube_json, namespace, "lent") or {}
    # bindsToNode: the allocation is pinned to the borrower the scheduler chose.
    terms = lent["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"]
    assert borrower in json.dumps(terms)

    claim_pod(kube_json, namespace, "local", donor, remote=False)
    wait_unschedulable(kube_json, namespace, "local")

    delete_pod_and_claim(kube_json, namespace, "lent")
    assert wait_allocated(kube_json, namespace, "local") == (donor, "gpu-0")
    # The local device of a lending pool prepares as before.
    wait_for(
        lambda: (
            (
                kube_json.get(path("v1", "pods", "local", namespace=namespace)).get("status") or {}
            ).get("phase")
            == "Running"
        ),
        60,
        "the local pod to run",
    )


def test_the_local_class_never_selects_a_lent_gpu(
    kube_json: Kube, cluster: Cluster, device_class: str, namespace: str
) -> None:
    """composable-gpu-local is a node's own GPUs: a borrower's claim of it is refused
    although the donor lends a free GPU, which a remote claim on that node then gets."""
    donor = cluster.donor(gpus=1, max_leases=2)
    borrower = cluster.node("borrower")
    local = {"deviceClassName": names.LOCAL_DEVICE_CLASS}
    create_claim_pod(kube_json, namespace, "local", node=borrower, exactly=local)
    wait_unschedulable(kube_json, namespace, "local")
    assert lend_and_bind(kube_json, namespace, "lent", borrower) == (donor, "gpu-0-remote")


def test_link_counter_caps_concurrent_leases(
    kube_json: Kube, cluster: Cluster, device_class: str, namespace: str
) -> None:
    donor = cluster.donor(gpus=3, max_leases=2)
    borrower = cluster.node("borrower")
    granted = set()
    for name in ("r1", "r2"):
        granted.add(lend_and_bind(kube_json, namespace, name, borrower))
    assert {pool for pool, _ in granted} == {donor} and len(granted) == 2
    # A third GPU is free, but the link is at its knee.
    claim_pod(kube_json, namespace, "r3", borrower, remote=True)
    wait_unschedulable(kube_json, namespace, "r3")

    delete_pod_and_claim(kube_json, namespace, "r1")
    pool, device = wait_allocated(kube_json, namespace, "r3")
    assert pool == donor and device.endswith("-remote")


def test_fabric_gpus_stay_in_the_nodes_plain_slice_and_lending_still_works(
    kube_json: Kube, cluster: Cluster, device_class: str, namespace: str
) -> None:
    # One lent GPU (per-device slice) and one fabric GPU (a plain slice with spec.nodeName,
    # where the operator's detach check finds it) in one pool: the scheduler sees the
    # pool complete from a borrower and from the donor.
    donor = cluster.donor(gpus=1, max_leases=1, fabric=1)
    by_node = kube_json.get(
        path(RESOURCE, "resourceslices"), fieldSelector=f"spec.nodeName={donor}"
    )["items"]
    assert {d["name"] for s in by_node for d in s["spec"].get("devices") or []} == {"gpu-1"}
    borrower = cluster.node("borrower")
    assert lend_and_bind(kube_json, namespace, "lent", borrower) == (donor, "gpu-0-remote")
    claim_pod(kube_json, namespace, "local", donor, remote=False)
    assert wait_allocated(kube_json, namespace, "local") == (donor, "gpu-1")
