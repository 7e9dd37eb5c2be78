"""Shared helpers for the tests that run real nodes: one RealNode of their own
(tests/e2e/test_real_node*.py), or a suite whose hosts are real nodes, wholly or in part
(``SuiteOptions.real_hosts``; the attach flow, cancellations, the examples...).

The suite helpers work whatever runs a host's node, so that one scenario asserts the same
on real kubelets and on kubelet emulators.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from composable_dra.k8s.kube import JSON, Kube, NotFound, path
from composable_dra.model import names
from dra_driver.cdi import resolve
from testbed.controlplane import ControlPlane
from testbed.harness import Suite
from testbed.objects import create_claim
from testbed.plugin_process import PluginProcess
from testbed.realnode import RealNode, find_node_binaries
from testbed.realnode_pods import ENV_AND_WAIT as ENV_AND_WAIT  # tests import it from here
from testbed.wait import wait_for
from testbed.workload import scenario_pod

RESOURCE = "resource.k8s.io/v1"


def node_binaries() -> Path:
    """The node binaries, built if missing. A real node needs root (mount namespaces,
    runc); under CI=true nothing is skipped: a missing binary is built or the test fails."""
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("a real node needs root (mount namespaces, runc); CI=true runs it")
    return find_node_binaries()


@contextlib.contextmanager
def started_nodes(
    cp: ControlPlane,
    bin_dir: Path,
    workdir: Path,
    names_: Sequence[str],
    images: Sequence[Path],
    system_uuids: Sequence[str] = (),
) -> Iterator[list[RealNode]]:
    """Real nodes ``names_`` (each in ``workdir/<name>``, with ``images`` imported; the
    systemUUIDs ``system_uuids`` in turn where given, e.g. fabric hosts'), started in turn,
    each start's time printed; all stopped at the end, and the ones already started when a
    start fails."""
    uuids = [*system_uuids, *[None] * (len(names_) - len(system_uuids))]
    made = [
        RealNode(n, bin_dir, cp, workdir / n, system_uuid=u, images=list(images))
        for n, u in zip(names_, uuids, strict=True)
    ]
    try:
        for node in made:
            t0 = time.monotonic()
            node.start()
            print(f"node {node.name} up in {time.monotonic() - t0:.1f}s", flush=True)
        yield made
    finally:
        for node in made:
            node.stop()


def node_slices(kube: Kube, node: str) -> list[JSON]:
    items: list[JSON] = kube.get(
        path(RESOURCE, "resourceslices"),
        fieldSelector=f"spec.nodeName={node},spec.driver={names.DRIVER}",
    )["items"]
    return items


def slice_devices(slices: list[JSON]) -> set[str]:
    return {d["name"] for s in slices for d in s["spec"].get("devices", [])}


def wait_running(kube: Kube, node: RealNode, namespace: str, pod: str, timeout: float = 90) -> JSON:
    pod_path = path("v1", "pods", pod, namespace=namespace)

    def running() -> JSON | None:
        node.check_alive()
        got: JSON = kube.get(pod_path)
        return got if got["status"].get("phase") == "Running" else None

    result: JSON = wait_for(
        running,
        timeout,
        f"pod {pod} to run on {node.name}",
        interval=0.3,
        describe=lambda: f"{kube.get(pod_path).get('status')}\n{node.logs_tail(15)}",
    )
    return result


def wait_output(
    node: RealNode, namespace: str, pod: str, marker: str, container: str = "main"
) -> str:
    """The output of the pod's ``container``, once it contains ``marker``."""

    def printed() -> str | None:
        log = node.container_log(namespace, pod, container)
        return log if marker in log else None

    out: str = wait_for(printed, 30, f"the output of {pod}/{container}", describe=node.logs_tail)
    print(
        f"--- output of {namespace}/{pod}/{container} on real node {node.name} ---\n{out}",
        flush=True,
    )
    return out


def printed_gpus(node: RealNode, namespace: str, pod: str) -> str:
    """What an example's container printed: ``GPUs: $COMPOSABLE_GPU_UUIDS``."""
    out = wait_output(node, namespace, pod, "GPUs: ")
    (line,) = [ln for ln in out.splitlines() if ln.startswith("GPUs: ")]
    return line.removeprefix("GPUs: ")


def gone(kube: Kube, obj_path: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            kube.get(obj_path)
        except NotFound:
            return True
        return False

    return check


def pod_with_claim(kube: Kube, node: RealNode, namespace: str, name: str) -> None:
    """A claim for one GPU and a pod on ``node`` using it, printing its environment."""
    create_claim(kube, namespace, name)
    pod = scenario_pod(name, name, node=node.name, run_seconds=None, real_image=node.image)
    kube.create(path("v1", "pods", namespace=namespace), pod)


# -- suites whose nodes may be real ----------------------------------------------------------


def suite_pod(
    suite: Suite,
    namespace: str,
    name: str,
    node: str | None = None,
    run_seconds: float | None = None,
    claim: JSON | None = None,
) -> JSON:
    """``Suite.create_pod`` (its own claim: ``claim``'s body, named like the pod, or one for
    a GPU, local ones first), made to run on real nodes where the suite has any, wherever
    the scheduler puts the pod (``create_pod`` makes it real only on a real node it names):
    ``scenario_pod``'s real container, which exits after ``run_seconds`` as the emulator's
    run annotation does."""
    if claim is None:
        suite.create_claim(namespace, name)
    else:
        body = {**claim, "metadata": {"name": name}}
        suite.kube.create(path(RESOURCE, "resourceclaims", namespace=namespace), body)
    real = next(iter(suite.real_nodes.values()), None)  # the nodes share the test image
    image = real.image if real is not None else None
    pod = scenario_pod(name, name, node=node, run_seconds=run_seconds, real_image=image)
    return suite.kube.create(path("v1", "pods", namespace=namespace), suite.on_own_nodes(pod))


def wait_succeeded(suite: Suite, namespace: str, pod: str, timeout: float = 90) -> None:
    """Until a ``suite_pod(..., run_seconds=...)`` pod ran and finished, real node or not."""
    wait_for(
        lambda: suite.pod(namespace, pod)["status"].get("phase") == "Succeeded",
        timeout,
        f"pod {namespace}/{pod} to run and finish",
        describe=lambda: describe_nodes(suite),
    )


def plugin_of(suite: Suite, host: str) -> PluginProcess:
    """The plugin of ``host``'s node, real or emulated."""
    real = suite.real_nodes.get(host)
    if real is not None:
        assert real.plugin is not None, f"the real node of {host} has no plugin"
        return real.plugin
    return suite.nodes[host].plugin


def cdi_dir_of(suite: Suite, host: str) -> Path:
    """Where ``host``'s plugin writes its CDI specs (the runtime reads them there)."""
    real = suite.real_nodes.get(host)
    return real.cdi_dir if real is not None else suite.nodes[host].kubelet.cdi_dir


def gpu_env(suite: Suite, namespace: str, pod: str) -> dict[str, str]:
    """The environment that the pod's container got from the CDI devices its claims were
    prepared with. On a real node, what the container printed (containerd injected it);
    on an emulated one, what the CDI specs of the devices that the emulator got back from
    NodePrepareResources inject (a runtime would resolve them the same way)."""
    got = suite.pod(namespace, pod)
    host = suite.host_of_node(got["spec"]["nodeName"])
    real = suite.real_nodes.get(host)
    if real is not None:
        out = wait_output(real, namespace, pod, "COMPOSABLE_GPU_UUIDS=")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    kubelet = suite.nodes[host].kubelet
    env: dict[str, str] = {}
    for ids in kubelet.prepared_devices(got["metadata"]["uid"]).values():
        for device_id in ids:
            device = resolve(kubelet.cdi_dir, device_id)
            assert device is not None, f"{device_id} resolves in no CDI spec"
            env.update(e.split("=", 1) for e in device["containerEdits"].get("env", []))
    return env


def describe_nodes(suite: Suite) -> str:
    """``suite.describe()`` and the real nodes' logs."""
    return "\n".join([suite.describe(), *(r.logs_tail(10) for r in suite.real_nodes.values())])
