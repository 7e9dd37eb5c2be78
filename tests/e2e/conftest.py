"""Fixtures for the end-to-end tests: one real control plane for the whole session."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from composable_dra.k8s.kube import Kube
from testbed import ControlPlane, versions
from testbed.claims_seen import ClaimsSeen
from testbed.controlplane import find_binaries
from testbed.harness import Suite, SuiteOptions
from testbed.objects import ensure_device_class
from testbed.realnode import RealNode
from testbed.realnodes import node_binaries

pytestmark = pytest.mark.e2e
_E2E = Path(__file__).resolve().parent
_CONTROL_PLANE = pytest.StashKey[ControlPlane]()
# make_suite(**SuiteOptions fields): a started suite, stopped after the test.
MakeSuite = Callable[..., Suite]
# claims_seen(kube, namespace): a ClaimsSeen, stopped after the test.
SeeClaims = Callable[[Kube, str], ClaimsSeen]


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    # No skip when binaries are missing: find_binaries builds them or fails (CI=true
    # or not), so an end-to-end test never silently passes without a control plane.
    bin_dir = find_binaries()
    workdir = Path(os.environ.get("CONTROL_PLANE_DIR") or tmp_path_factory.mktemp("cp"))
    # A gated run's gates (testbed/versions.py), on the nodes' kubelets too (RealNode).
    with ControlPlane(bin_dir, workdir=workdir, feature_gates=versions.run_gates()) as cp:
        request.session.stash[_CONTROL_PLANE] = cp
        yield cp
        del request.session.stash[_CONTROL_PLANE]


@pytest.fixture(scope="session")
def kube(control_plane: ControlPlane) -> client.ApiClient:
    return control_plane.api_client()


@pytest.fixture
def namespace(kube: client.ApiClient) -> Iterator[str]:
    """A namespace of its own for each test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube)
    core.create_namespace(body={"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture
def unique() -> str:
    """A short random suffix for cluster-scoped names."""
    return uuid.uuid4().hex[:6]


@pytest.fixture(scope="session")
def kube_json(kube: client.ApiClient) -> Kube:
    """Plain-dict access to the test control plane."""
    return Kube(kube)


@pytest.fixture
def device_class(kube_json: Kube) -> str:
    """The examples' DeviceClass: every device of our driver (kept for the session)."""
    return ensure_device_class(kube_json)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary directory with a short path: unix socket paths must stay under 108 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="cdra-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the control plane's recent logs to a failed end-to-end test's report."""
    report = yield
    cp = item.session.stash.get(_CONTROL_PLANE, None)
    if report.failed and cp is not None:
        report.sections.append(("control plane logs", cp.logs_tail(30)))
    return report


def _node_names(cp: ControlPlane) -> set[str]:
    api = cp.api_client()
    with api:
        return {n.metadata.name for n in client.CoreV1Api(api).list_node().items}


@pytest.fixture(autouse=True)
def leaves_no_node(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test deletes the Nodes it registered: the control plane is shared by the
    session, and a node left behind (with its slices) takes the pods of later tests.
    Torn down after the test's own fixtures; a leftover is deleted, then reported."""
    cp = request.session.stash.get(_CONTROL_PLANE, None)
    before = _node_names(cp) if cp is not None else set()
    yield
    cp = request.session.stash.get(_CONTROL_PLANE, None)
    if cp is None:
        return
    leftover = sorted(_node_names(cp) - before)
    if leftover:
        api = cp.api_client()
        with api:
            for name in leftover:
                client.CoreV1Api(api).delete_node(name)
        pytest.fail(f"the test left Nodes behind: {leftover}")


@pytest.fixture(scope="module")
def node_bin_dir() -> Path:
    """The real-node binaries (testbed/realnodes.py: built if missing; never skipped
    under CI=true)."""
    return node_binaries()


@pytest.fixture
def real_node(
    control_plane: ControlPlane, node_bin_dir: Path, short_tmp: Path, unique: str
) -> Iterator[RealNode]:
    """One real node (kubelet, containerd, runc) registered with the control plane."""
    node = RealNode(f"real-{unique}", node_bin_dir, control_plane, short_tmp / "n")
    node.start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def make_suite(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path
) -> Iterator[MakeSuite]:
    """Start whole suites (every component a process) on the session's control plane.
    The hosts in ``real_hosts`` run as real nodes (the node binaries found or built)."""
    suites: list[Suite] = []

    def make(**options: Any) -> Suite:
        if options.get("real_hosts") and options.get("node_bin_dir") is None:
            options["node_bin_dir"] = node_binaries()
        suite = Suite(
            kube_json,
            control_plane.kubeconfig,
            short_tmp / f"s{len(suites)}",
            SuiteOptions(**options),
            control_plane=control_plane,
        )
        suites.append(suite)
        return suite.start()

    yield make
    # Zero surprise removals (fabric_emulator/host_bus.py), asked of each live emulator
    # before the teardown's own forced detaches: one request per suite.
    try:
        surprises = [r for s in suites if s.emulator.proc for r in s.unexpected_surprise_removals()]
    finally:
        for s in suites:
            s.stop()
    assert not surprises, f"the fabric removed GPUs their hosts still held: {surprises}"


@pytest.fixture
def claims_seen() -> Iterator[SeeClaims]:
    """Records of a namespace's claims (testbed.claims_seen), each stopped after the test:
    its watch ends with the test, not with its timeout after the control plane."""
    made: list[ClaimsSeen] = []

    def make(kube: Kube, namespace: str) -> ClaimsSeen:
        made.append(ClaimsSeen(kube, namespace))
        return made[-1]

    yield make
    for seen in made:
        seen.stop()


@pytest.fixture
def donor_of_four(
    kube_json: Kube, control_plane: ControlPlane, short_tmp: Path, unique: str, namespace: str
) -> Iterator[Any]:
    """A RemoteSetup (tests/e2e/test_remote_lease.py): donor A lending four GPUs, consumer
    C, the scaler; started, and closed after the test."""
    from tests.e2e.test_remote_lease import RemoteSetup

    setup = RemoteSetup(kube_json, control_plane, short_tmp, unique, namespace, gpus=4)
    try:
        setup.start()
        yield setup
    finally:
        setup.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the end-to-end tests not meant for this run's release (testbed/versions.py):
    a run on an older release runs its subset, never skips."""
    release = versions.run_label()
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        marker = item.get_closest_marker(versions.MARKER)
        runs = _E2E not in item.path.parents or versions.runs_on(
            marker.args if marker else None,
            bool(marker.kwargs.get("default", True)) if marker else True,
            release,
            tuple(marker.kwargs.get("gated", ())) if marker else (),
        )
        (keep if runs else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
