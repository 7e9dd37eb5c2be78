"""A remote GPU end to end: lease controller, donor lease API, prepare on the consumer.

Every component is its own process on the real control plane: donor A's plugin lends
its GPU (``--lend``, kubelet emulator), the donor (``remote-gpu-donor`` with its lease
API over HTTPS), the scaler (whose lease controller opens leases), and node C's plugin
(no GPU, no fabric) under its own kubelet emulator, proving its node to the donor with
the token of a pod on its node (the harness plays the kubelet: a Pod there, and a
TokenRequest bound to it with the node's own credentials). The control plane runs the
Node authorizer and NodeRestriction, so the forged cases are the ones a cluster has: one
node's plugin identity, or its kubelet's credentials, against another node's lease. The
pod's claim selects a remote device; the test builds ``RemoteGPU.from_env()`` from the
env the CDI spec gives the container (the token file the plugin wrote, mapped through the
spec's mount) and runs ``matmul`` on the donor.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from composable_dra.k8s.kube import JSON, Kube, KubeError, path
from composable_dra.lending.remote_leases import (
    DONORS_AUDIENCE,
    Code,
    DonorDirectory,
    FileToken,
    LeaseAPIError,
    LeaseClient,
    LeaseInfo,
    Tokens,
    TokenSource,
    audience,
)
from dra_driver import cdi
from remote_gpu.client import RemoteGPU
from remote_gpu.errors import RemoteGPUError
from testbed import ControlPlane, chart
from testbed.containers import on_host
from testbed.controlplane import free_port
from testbed.crds import install_crds
from testbed.kubelet_emulator import KubeletEmulator
from testbed.lending import (
    CONTROLLER_SA,
    PLUGIN_SA,
    donor_flags,
    donor_process,
    plugin_token,
    scaler_process,
)
from testbed.pki import CertificateAuthority
from testbed.plugin_process import PluginProcess, write_static_devices
from testbed.pod_token import PodToken, bearer_kube, request_token
from testbed.process import ComponentProcess
from testbed.wait import wait_for
from testbed.wake import touches
from tests.e2e.test_chart import RBAC_KINDS, Access, Release, Resources, wrong_access
from tests.e2e.test_lend import (
    DRIVER,
    Cluster,
    allocated,
    claim_pod,
    get_claim,
    wait_allocated,
)

pytestmark = pytest.mark.usefixtures("device_class")

RESOURCE = "resource.k8s.io/v1"
SHM = Path("/dev/shm")


class RemoteSetup:
    """Donor A (lending plugin + donor process), consumer C (plugin), the scaler."""

    def __init__(
        self, kube: Kube, cp: ControlPlane, root: Path, unique: str, ns: str, gpus: int = 1
    ) -> None:
        self.kube, self.cp, self.root, self.ns = kube, cp, root, ns
        self.gpus = gpus  # the donor's, each lent
        self.cluster = Cluster(kube, cp, root, unique)
        self.procs: list[ComponentProcess] = []
        self.consumer_kubelet: KubeletEmulator | None = None
        self.consumer_plugin: PluginProcess | None = None
        self.tokens: list[PodToken] = []
        self.ca = CertificateAuthority(root / "pki")
        self.tls = self.ca.issue("donor", "donor", ips=("127.0.0.1",), server=True)
        for sa in (CONTROLLER_SA, PLUGIN_SA):
            kube.create(path("v1", "serviceaccounts", namespace=ns), {"metadata": {"name": sa}})
        self.data_port, self.api_port = free_port(), free_port()
        self.secret = root / "donor-secret"
        self.secret.write_bytes(os.urandom(32).hex().encode())

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def donor_flags(self) -> list[str]:
        return donor_flags({self.donor: self.api_url}, self.ca.cert_path)

    def pod_token(self, node: str) -> PodToken:
        """The token of a plugin pod on ``node``, as its kubelet would keep it."""
        root = self.root / f"token-{node}"
        token = plugin_token(self.cp, self.kube, node, self.ns, root).start()
        self.tokens.append(token)
        return token

    def start(self) -> None:
        self.donor = self.cluster.donor(gpus=self.gpus, max_leases=max(2, self.gpus))
        self.donor_proc = donor_process(
            self.donor,
            self.secret,
            self.tls,
            (self.data_port, self.api_port),
            self.cp,
            self.ns,
            self.root / "donor",
        )
        self.start_donor()
        install_crds(self.kube)
        controller = [f"--lease-service-account={self.ns}/{CONTROLLER_SA}", *self.donor_flags()]
        scaler = scaler_process(self.cp, controller, self.root / "scaler")
        self.procs.append(scaler.start())
        self.consumer = self.cluster.node("consumer")
        kubelet = KubeletEmulator(self.kube, self.consumer, self.root / "kc", self.root / "cdic")
        kubelet.start()
        self.consumer_kubelet = kubelet
        self.consumer_token = self.pod_token(self.consumer)
        plugin = PluginProcess.beside(
            kubelet,
            self.consumer,
            self.cp.kubeconfig,
            self.root / "consumer-plugin",
            [f"--lease-token-file={self.consumer_token.file}", *self.donor_flags()],
        )
        write_static_devices(plugin.static_file, [])
        plugin.start()
        self.consumer_plugin = plugin
        wait_for(
            lambda: DRIVER in kubelet.registered_drivers(),
            30,
            "the consumer's plugin to register",
            describe=plugin.log_tail,
        )

    def start_donor(self) -> None:
        proc = self.donor_proc.start()
        wait_for(
            lambda: any(e.get("event") == "lease API listening" for e in proc.log_events(True)),
            30,
            "the donor's lease API",
            describe=proc.log_tail,
        )

    def client(self, tokens: Tokens) -> LeaseClient:
        return LeaseClient(
            DonorDirectory({self.donor: self.api_url}), tokens, str(self.ca.cert_path)
        )

    def as_account(self, sa: str) -> LeaseClient:
        """A lease API client with real, unbound tokens of ``sa`` for the donor's audience."""
        return self.client(TokenSource(self.kube, self.ns, sa))

    def leases(self) -> list[LeaseInfo]:
        """The donor's open leases, asked as the lease controller."""
        return self.as_account(CONTROLLER_SA).list(self.donor).items

    def describe(self) -> str:
        parts = [p.log_tail(30) for p in (*self.procs, self.donor_proc)]
        if self.consumer_plugin is not None:
            parts.append(self.consumer_plugin.log_tail(30))
        return "\n".join(parts)

    def close(self) -> None:
        for p in self.procs:
            p.stop()
        for t in self.tokens:
            t.stop()
        if getattr(self, "donor_proc", None) is not None:
            self.donor_proc.stop()
        if self.consumer_plugin is not None:
            self.consumer_plugin.stop()
        if self.consumer_kubelet is not None:
            self.consumer_kubelet.stop()
        self.cluster.close()


@pytest.fixture
def remote(
    kube_json: Kube,
    control_plane: ControlPlane,
    short_tmp: Path,
    unique: str,
    namespace: str,
) -> Iterator[RemoteSetup]:
    setup = RemoteSetup(kube_json, control_plane, short_tmp, unique, namespace)
    try:
        setup.start()
        yield setup
    finally:
        setup.close()


def device_status(claim: JSON) -> JSON | None:
    for st in (claim.get("status") or {}).get("devices") or []:
        if st["device"].endswith("-remote"):
            found: JSON = st
            return found
    return None


def condition(claim: JSON | None, kind: str) -> JSON | None:
    st = device_status(claim or {}) or {}
    for c in st.get("conditions") or []:
        if c["type"] == kind and c["status"] == "True":
            found: JSON = c
            return found
    return None


def pod_running(kube: Kube, ns: str, name: str) -> bool:
    pod = kube.get_or_none(path("v1", "pods", name, namespace=ns)) or {}
    return (pod.get("status") or {}).get("phase") == "Running"


def container_env(setup: RemoteSetup, pod: JSON) -> tuple[dict[str, str], dict[str, str]]:
    """The env the CDI spec gives the pod's container, and its mounts (container path ->
    host path), as a container runtime would apply them."""
    assert setup.consumer_kubelet is not None
    ids = setup.consumer_kubelet.prepared_devices(pod["metadata"]["uid"])
    env: dict[str, str] = {}
    mounts: dict[str, str] = {}
    for device_id in [i for v in ids.values() for i in v]:
        dev = cdi.resolve(setup.consumer_kubelet.cdi_dir, device_id)
        assert dev is not None, device_id
        edits: dict[str, Any] = dev["containerEdits"]
        env.update(e.split("=", 1) for e in edits.get("env") or [])
        mounts.update({m["containerPath"]: m["hostPath"] for m in edits.get("mounts") or []})
    return env, mounts


def on_the_host(env: dict[str, str], mounts: dict[str, str]) -> dict[str, str]:
    """The container's env with its paths as the host sees them: the lease's directory
    is the host directory the spec mounts there."""
    return {k: on_host(v, mounts) for k, v in env.items()}


def run_matmul(env: dict[str, str], mounts: dict[str, str]) -> None:
    local = on_the_host(env, mounts)
    rng = np.random.default_rng(7)
    a, b = rng.random((64, 32)), rng.random((32, 16))
    with RemoteGPU.from_env(local, timeout=10) as gpu:
        (out,) = gpu.invoke("matmul", a, b)
    np.testing.assert_allclose(out, a @ b)


def lease_and_run(setup: RemoteSetup, name: str) -> tuple[JSON, dict[str, str], dict[str, str]]:
    kube, ns = setup.kube, setup.ns
    claim_pod(kube, ns, name, setup.consumer, remote=True)
    assert wait_allocated(kube, ns, name) == (setup.donor, "gpu-0-remote")
    ready = wait_for(
        lambda: condition(get_claim(kube, ns, name), "RemoteGPUReady"),
        60,
        "RemoteGPUReady on the claim",
        describe=setup.describe,
    )
    assert ready["reason"] == "LeaseOpen"
    claim = get_claim(kube, ns, name) or {}
    data = (device_status(claim) or {})["data"]
    assert data["donor"] == setup.donor
    assert data["endpoint"] == f"127.0.0.1:{setup.data_port}"
    # No credentials in the claim: the lease id and where, nothing that opens it.
    assert set(data) == {"donor", "endpoint", "lease", "instance"}
    wait_for(lambda: pod_running(kube, ns, name), 60, "the pod to run", describe=setup.describe)
    pod = kube.get(path("v1", "pods", name, namespace=ns))
    env, mounts = container_env(setup, pod)
    assert env["REMOTE_GPU_ENDPOINT"] == data["endpoint"]
    assert env["REMOTE_GPU_LEASE"] == str(data["lease"])
    token_file = Path(on_host(env["REMOTE_GPU_TOKEN_FILE"], mounts))
    assert token_file.stat().st_mode & 0o777 == 0o444  # for any container user
    assert json.loads(token_file.read_text())["lease"] == data["lease"]
    assert mounts[env["REMOTE_GPU_DIR"]] == str(token_file.parent)  # the directory mounted
    assert [i.lease for i in setup.leases()] == [data["lease"]]
    return claim, env, mounts


def end_pod_and_claim(setup: RemoteSetup, name: str) -> None:
    kube, ns = setup.kube, setup.ns
    kube.delete(path("v1", "pods", name, namespace=ns))
    wait_for(
        lambda: kube.get_or_none(path("v1", "pods", name, namespace=ns)) is None,
        60,
        "the pod to go (unprepared by the consumer's kubelet)",
        describe=setup.describe,
    )
    kube.delete(path(RESOURCE, "resourceclaims", name, namespace=ns))
    wait_for(lambda: get_claim(kube, ns, name) is None, 60, "the claim to go")


def test_remote_gpu_runs_matmul_and_leaves_nothing(remote: RemoteSetup) -> None:
    claim, env, mounts = lease_and_run(remote, "lent")
    run_matmul(env, mounts)
    # Real TokenReviews: the credentials go to the consumer node's plugin only, not to
    # the plugin of another node, an unbound token of the plugins' account or the
    # controller.
    lease = int(env["REMOTE_GPU_LEASE"])
    others: dict[str, Tokens] = {
        "the donor node's plugin": FileToken(remote.pod_token(remote.donor).file),
        "an unbound plugin token": TokenSource(remote.kube, remote.ns, PLUGIN_SA),
        "the controller": TokenSource(remote.kube, remote.ns, CONTROLLER_SA),
    }
    for who, tokens in others.items():
        with pytest.raises(LeaseAPIError) as err:
            remote.client(tokens).credentials(remote.donor, lease)
        assert err.value.code is Code.FORBIDDEN, (who, err.value)
    with pytest.raises(LeaseAPIError) as err:  # and leases open for the controller only
        remote.client(FileToken(remote.consumer_token.file)).list(remote.donor)
    assert err.value.code is Code.FORBIDDEN
    token_file = Path(on_host(env["REMOTE_GPU_TOKEN_FILE"], mounts))
    mac = json.loads(token_file.read_text())["mac"]

    end_pod_and_claim(remote, "lent")
    assert not token_file.exists()
    wait_for(lambda: remote.leases() == [], 30, "the lease to close", describe=remote.describe)
    # The lease's secret (the token's MAC) and the donor's key reached no log, no Event
    # and not the claim.
    events = remote.kube.get(path("v1", "events", namespace=remote.ns))["items"]
    reasons = {e["reason"] for e in events if e["involvedObject"].get("name") == "lent"}
    assert "RemoteGPUReady" in reasons
    logs = [p.read_text(errors="replace") for p in remote.root.rglob("*.log")]
    assert len(logs) >= 4  # donor, scaler, both plugins
    for text in (*logs, json.dumps(events), json.dumps(claim)):
        assert mac not in text
        assert remote.secret.read_text() not in text


class Fixed:
    """One token, whatever the audience asked."""

    def __init__(self, token: str) -> None:
        self.value = token

    def token(self, aud: str) -> str:
        return self.value


def test_a_node_cannot_act_as_another_nodes_plugin(remote: RemoteSetup) -> None:
    """Node X (the donor's node: its plugin is a plugin like any other) against consumer
    C's lease, with the Node authorizer and NodeRestriction on: X's plugin pod's token
    is refused C's credentials and the close; X's kubelet credentials cannot have a
    token bound to C's plugin pod or to Node C; X's plugin's own API token cannot have
    one at all; and the proof the donor took before, a plugin-account token bound to the
    Node object (which whoever may create the account's tokens can make for any node),
    is refused."""
    kube, ns = remote.kube, remote.ns
    _claim, env, _mounts = lease_and_run(remote, "lent")
    lease = int(env["REMOTE_GPU_LEASE"])
    x = remote.pod_token(remote.donor)
    x_plugin = remote.client(FileToken(x.file))
    node_c = kube.get(path("v1", "nodes", remote.consumer))
    node_bound = Fixed(request_token(kube, ns, PLUGIN_SA, node_c, DONORS_AUDIENCE))
    callers = {"X's plugin": x_plugin, "a Node-bound token": remote.client(node_bound)}
    for who, client in callers.items():
        for call in (client.credentials, client.close):
            with pytest.raises(LeaseAPIError) as err:
                call(remote.donor, lease)
            assert err.value.code is Code.FORBIDDEN, (who, call, err.value)
    assert [i.lease for i in remote.leases()] == [lease]  # still open

    # X's kubelet may have tokens for the pods on X only.
    x_kubelet = x.node_kube()
    c_pod = remote.consumer_token.pod
    for bound in (c_pod, node_c):
        for aud in (DONORS_AUDIENCE, audience(remote.donor)):
            with pytest.raises(KubeError) as kerr:
                request_token(x_kubelet, ns, PLUGIN_SA, bound, aud)
            assert kerr.value.status == 403, (bound["kind"], aud, kerr.value)
    # X's plugin pod's API token (what its pod holds) asks for C's: the plugins' account
    # may create no tokens.
    api_token = request_token(x_kubelet, ns, PLUGIN_SA, x.pod, None)
    as_plugin = bearer_kube(remote.cp, api_token)
    for bound in (c_pod, node_c):  # 403, not 401: authenticated, and refused
        with pytest.raises(KubeError) as kerr:
            request_token(as_plugin, ns, PLUGIN_SA, bound, DONORS_AUDIENCE)
        assert kerr.value.status == 403, (bound["kind"], kerr.value)

    # C's own plugin still collects and closes: the pod ends, the lease with it.
    end_pod_and_claim(remote, "lent")
    wait_for(lambda: remote.leases() == [], 30, "the lease to close", describe=remote.describe)


def reopened_at(claim: JSON | None, instance: str) -> JSON | None:
    """The claim's RemoteGPUReady once another donor instance than ``instance`` wrote it."""
    data = (device_status(claim or {}) or {}).get("data") or {}
    return condition(claim, "RemoteGPUReady") if data.get("instance") != instance else None


def test_donor_killed_mid_lease_and_back_reopens_the_lease(remote: RemoteSetup) -> None:
    """Issue 31 item 3 at the API's level: the donor restarts (same node and device, a
    new process without leases); the controller opens the claim's lease again and the
    consumer's plugin writes the new lease into the directory the pod has mounted."""
    claim, env, mounts = lease_and_run(remote, "lent")
    local = on_the_host(env, mounts)
    old_token = remote.root / "old-token"
    old_token.write_bytes(Path(local["REMOTE_GPU_TOKEN_FILE"]).read_bytes())
    a = np.ones((8, 8))
    arenas = f"remote-gpu-{int(env['REMOTE_GPU_LEASE']):016x}-*"
    # One connection, no reconnect. (A lease's worker may take seconds to start on a
    # loaded machine: the handshake's deadline allows for it.)
    with RemoteGPU.from_env(local, timeout=15) as gpu:
        gpu.invoke("matmul", a, a)
        assert list(SHM.glob(arenas))  # the lease's arena, while it serves
        remote.donor_proc.kill()
        with pytest.raises(RemoteGPUError):
            gpu.invoke("matmul", a, a)
    # The killed donor's worker ends with its lease and takes the arena with it.
    wait_for(lambda: not list(SHM.glob(arenas)), 30, "the lease's arena to go")
    # The donor comes back with no leases: the controller opens the claim's lease again.
    first = (device_status(claim) or {})["data"]
    remote.start_donor()
    reopened = wait_for(
        lambda: reopened_at(get_claim(remote.kube, remote.ns, "lent"), first["instance"]),
        60,
        "the lease re-opened at the restarted donor",
        describe=remote.describe,
    )
    assert reopened["reason"] == "LeaseReopened"
    data = (device_status(get_claim(remote.kube, remote.ns, "lent") or {}) or {})["data"]
    assert data["lease"] != first["lease"] and data["endpoint"] == first["endpoint"]
    assert [i.lease for i in remote.leases()] == [data["lease"]]
    # The consumer's plugin writes the new lease into the mounted directory.
    token_file = Path(local["REMOTE_GPU_TOKEN_FILE"])
    wait_for(
        lambda: json.loads(token_file.read_text())["lease"] == data["lease"],
        30,
        "the consumer's plugin to write the re-opened lease's token",
        describe=remote.describe,
    )
    # The old token opens nothing at the restarted donor; the directory's files do.
    stale = {"REMOTE_GPU_ENDPOINT": first["endpoint"], "REMOTE_GPU_TOKEN_FILE": str(old_token)}
    with pytest.raises(RemoteGPUError):
        RemoteGPU.from_env(stale, timeout=5)
    run_matmul(env, mounts)
    end_pod_and_claim(remote, "lent")
    assert not token_file.exists()
    wait_for(lambda: remote.leases() == [], 30, "the lease to close", describe=remote.describe)


def test_chart_rbac_for_leases_is_what_they_need_and_no_more(
    kube_json: Kube, namespace: str, unique: str
) -> None:
    """SubjectAccessReviews against the chart's roles with remote GPUs on."""
    rel = f"r{unique}"
    release = Release(Resources(kube_json), namespace)
    try:
        for obj in chart.render(
            release=rel, namespace=namespace, values={"remoteGPU": {"enabled": True}}
        ):
            if obj["kind"] in RBAC_KINDS:
                release.create(obj)

        def sa(component: str) -> str:
            return f"{rel}-composable-dra-{component}"

        def token_for(component: str) -> Access:
            return Access(
                "create", "serviceaccounts", subresource="token", namespace="@", name=sa(component)
            )

        expected = {
            # No tokens, not even its own: its pod's token is the kubelet's to make.
            "plugin": (
                [], [token_for("plugin"), token_for("scaler"), token_for("remote-gpu-donor")]
            ),
            "scaler": ([token_for("scaler")], [token_for("plugin")]),
            "remote-gpu-donor": (
                [Access("create", "tokenreviews", "authentication.k8s.io"),
                 Access("get", "resourceclaims", "resource.k8s.io", namespace="any", name="c")],
                [Access("list", "resourceclaims", "resource.k8s.io"),
                 Access("patch", "resourceclaims", "resource.k8s.io", "status", namespace="any"),
                 token_for("plugin"),
                 Access("get", "secrets", namespace="@")],
            ),
        }  # fmt: skip
        wrong = wrong_access(kube_json, namespace, rel, expected)
        assert not wrong, "\n".join(wrong)
    finally:
        release.cleanup()


def test_donor_unreachable_fails_the_lease_and_the_pod_runs_once_it_returns(
    remote: RemoteSetup,
) -> None:
    kube, ns = remote.kube, remote.ns
    assert remote.donor_proc.stop() == 0
    claim_pod(kube, ns, "late", remote.consumer, remote=True)
    scaler = remote.procs[0]
    wait_for(
        lambda: any(
            e.get("event") == "remote GPU failed" and e.get("reason") == "DonorUnreachable"
            for e in scaler.log_events()
        ),
        60,
        "RemoteGPUFailed for the unreachable donor",
        describe=remote.describe,
    )
    pod = kube.get(path("v1", "pods", "late", namespace=ns))
    assert not pod["spec"].get("nodeName")  # the failure condition kept it from binding
    # The scheduler picks again; once the donor is back, the lease opens and the pod runs.
    remote.start_donor()
    wait_for(lambda: pod_running(kube, ns, "late"), 90, "the pod to run", describe=remote.describe)
    pod = kube.get(path("v1", "pods", "late", namespace=ns))
    run_matmul(*container_env(remote, pod))
    end_pod_and_claim(remote, "late")
    wait_for(lambda: remote.leases() == [], 30, "the lease to close", describe=remote.describe)


def test_a_restarted_controller_closes_the_leases_no_claim_holds(remote: RemoteSetup) -> None:
    """The claim goes while the controller is down: it closes the lease from the donor's
    list when it starts. (The pod is on a node with no kubelet, so no plugin ever
    prepared the claim or would close the lease at unprepare.)"""
    kube, ns = remote.kube, remote.ns
    idle = remote.cluster.node("idle")
    claim_pod(kube, ns, "orphan", idle, remote=True)
    wait_for(
        lambda: condition(get_claim(kube, ns, "orphan"), "RemoteGPUReady"),
        60,
        "RemoteGPUReady on the claim",
        describe=remote.describe,
    )
    (held,) = remote.leases()
    scaler = remote.procs[0]
    scaler.kill()
    kube.delete(path("v1", "pods", "orphan", namespace=ns), gracePeriodSeconds=0)
    kube.delete(path(RESOURCE, "resourceclaims", "orphan", namespace=ns))
    wait_for(lambda: get_claim(kube, ns, "orphan") is None, 60, "the claim to go")
    assert [i.lease for i in remote.leases()] == [held.lease]  # nobody closed it yet
    scaler.start()
    wait_for(lambda: remote.leases() == [], 60, "the lease to close", describe=remote.describe)


def test_a_claim_used_by_a_second_pod_gets_a_new_lease(remote: RemoteSetup) -> None:
    """The first pod's end closes its lease (the plugin, at unprepare) and the claim,
    reserved by no pod, is deallocated; the next pod on it gets a new allocation and a
    new lease, and runs."""
    kube, ns = remote.kube, remote.ns
    claim, env, mounts = lease_and_run(remote, "shared")
    first = (device_status(claim) or {})["data"]["lease"]
    run_matmul(env, mounts)
    kube.delete(path("v1", "pods", "shared", namespace=ns))
    wait_for(lambda: allocated(kube, ns, "shared") is None, 60, "the claim to be deallocated")
    wait_for(lambda: remote.leases() == [], 30, "the lease to close", describe=remote.describe)
    pod = {
        "metadata": {"name": "second"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": remote.consumer},
            "containers": [
                {
                    "name": "main",
                    "image": "example.invalid/app",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
        },
    }
    kube.create(path("v1", "pods", namespace=ns), pod)
    wait_for(lambda: pod_running(kube, ns, "second"), 60, "the second pod to run")
    env, mounts = container_env(remote, kube.get(path("v1", "pods", "second", namespace=ns)))
    assert int(env["REMOTE_GPU_LEASE"]) != first
    run_matmul(env, mounts)
    kube.delete(path("v1", "pods", "second", namespace=ns))
    kube.delete(path(RESOURCE, "resourceclaims", "shared", namespace=ns))
    wait_for(lambda: remote.leases() == [], 60, "every lease to close", describe=remote.describe)


def test_a_lease_cancelled_while_its_pod_waits_wakes_the_pod_that_waits_for_the_gpu(
    remote: RemoteSetup,
) -> None:
    """The lending path of issue 25's cancellations: the donor's one GPU is allocated to a
    claim whose pod waits in PreBind for RemoteGPUReady (the lease controller is down, so
    no lease opens); the pod and its claim go, and a second pod is created at once. The
    scheduler still holds the first allocation in flight and finds the second pod
    unschedulable; it lets go at its next binding-condition check (<= 5 s), and no event
    follows. The donor's plugin touches its pool once after that check, so the second pod
    runs well within the scheduler's 5 min flush of unschedulable pods."""
    kube, ns = remote.kube, remote.ns
    donor = remote.cluster.plugin
    assert donor is not None
    scaler = remote.procs[0]
    scaler.kill()  # nothing opens a lease: the pod waits in PreBind
    claim_pod(kube, ns, "held", remote.consumer, remote=True)
    assert wait_allocated(kube, ns, "held") == (remote.donor, "gpu-0-remote")
    assert not kube.get(path("v1", "pods", "held", namespace=ns))["spec"].get("nodeName")
    kube.delete(path("v1", "pods", "held", namespace=ns), gracePeriodSeconds=0)
    kube.delete(path(RESOURCE, "resourceclaims", "held", namespace=ns))
    ended = time.monotonic()
    claim_pod(kube, ns, "waits", remote.consumer, remote=True)
    scaler.start()
    wait_for(
        lambda: pod_running(kube, ns, "waits"),
        30,
        "the pod that waited for the GPU to run",
        describe=lambda: f"{remote.describe()}\n{donor.log_tail(30)}",
    )
    print(f"the waiting pod ran {time.monotonic() - ended:.1f} s after the cancellation")
    # One extra slice write for the cancellation, no more.
    assert len(touches(donor.process)) == 1
    run_matmul(*container_env(remote, kube.get(path("v1", "pods", "waits", namespace=ns))))
    end_pod_and_claim(remote, "waits")
    assert len(touches(donor.process)) == 1  # a bound claim's end: none
