"""Runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler as local processes.

The flags are the ones fake nodes need (docs/architecture.md, Testing): the apiserver advertises
127.0.0.1 and skips the ServiceAccount and TaintNodesByCondition admission plugins, and
the node lifecycle controller is off, so Node objects with a Ready condition and no
kubelet stay schedulable. Nodes are held to what a cluster holds them to: the Node
authorizer and the NodeRestriction admission plugin judge every ``system:node:<name>``
client (the real kubelets, and the harness where it plays a kubelet), so a node's
credentials reach only its own node's objects.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import textwrap
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import config
from kubernetes.client import ApiClient

from composable_dra.k8s.kube import Kube
from testbed.pki import CertificateAuthority, KeyPair, write_service_account_key
from testbed.wait import WaitTimeout, wait_for

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ControlPlaneError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# The supported releases besides the default (the one hack/control-plane/kubernetes/go.mod
# pins): the newest patch of each minor the module proxy serves. The build scripts build
# any of them with KUBE_VERSION, once, cached by version.
RELEASES = {"1.35": "v1.35.8", "1.36": "v1.36.5"}


def cached_build(
    env_var: str,
    script: str,
    binaries: Sequence[str],
    bin_dir: str | os.PathLike[str] | None,
    version: str | None = None,
) -> Path:
    """The directory named by ``bin_dir`` or $``env_var``, or else the one the build script
    ``hack/<script>`` prints last (it builds what is missing, cached by version), checked to
    hold every one of ``binaries``. With ``version``, that Kubernetes release is built
    (KUBE_VERSION) and $``env_var``, which names the default's, is not read. RuntimeError
    names what failed."""
    if bin_dir is None and version is None:
        bin_dir = os.environ.get(env_var)
    if bin_dir is None:
        path = Path(__file__).resolve().parents[1] / "hack" / script
        env = {**os.environ, "KUBE_VERSION": version} if version else None
        out = subprocess.run(
            ["bash", str(path)], stdout=subprocess.PIPE, text=True, check=False, env=env
        )
        if out.returncode != 0:
            raise RuntimeError(f"{path} failed (exit {out.returncode}); see its output")
        bin_dir = out.stdout.strip().splitlines()[-1]
    found = Path(bin_dir)
    missing = [b for b in binaries if not os.access(found / b, os.X_OK)]
    if missing:
        raise RuntimeError(f"missing binaries in {found}: {', '.join(missing)}")
    return found


def find_binaries(
    bin_dir: str | os.PathLike[str] | None = None, version: str | None = None
) -> Path:
    """The directory holding the control plane binaries: KUBE_BIN_DIR or the build script;
    with ``version`` (e.g. RELEASES["1.35"]), that release's, built once if need be."""
    try:
        return cached_build("KUBE_BIN_DIR", "control-plane/build.sh", BINARIES, bin_dir, version)
    except RuntimeError as exc:
        raise ControlPlaneError(f"control plane: {exc}") from exc


@dataclass
class BinaryProcess:
    """A binary the harness started (etcd, the API server, a kubelet...) and its log."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def spawn(
        cls, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> BinaryProcess:
        with log.open("ab") as out:
            popen = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches us, not them
            )
        return cls(name, popen, log)

    def stop(self, timeout: float) -> None:
        """SIGTERM; SIGKILL if it has not exited after ``timeout`` seconds."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def start_or_report(
    start: Callable[[], None], stop: Callable[[], None], logs_tail: Callable[[], str]
) -> None:
    """Run ``start``, with ``stop`` registered to run at exit (an interrupted test run
    still cleans up); if it fails, stop what it started and print the logs, then raise."""
    atexit.register(stop)
    try:
        start()
    except BaseException:
        report = logs_tail()
        stop()
        if report:
            print(report, flush=True)
        raise


def exited(procs: Sequence[BinaryProcess]) -> str:
    """The processes that have exited, as ``name (exit N), ...``; empty when none."""
    return ", ".join(
        f"{p.name} (exit {p.popen.returncode})" for p in procs if p.popen.poll() is not None
    )


def log_tails(procs: Sequence[BinaryProcess], lines: int, prefix: str = "") -> list[str]:
    """The last ``lines`` of each process's log, under a header naming it."""
    parts = []
    for proc in procs:
        try:
            text = proc.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            continue
        if text:
            parts.append(f"--- {prefix}{proc.name} ({proc.log}) ---\n" + "\n".join(text))
    return parts


@dataclass(frozen=True)
class _Certificates:
    pki: Path
    serving: KeyPair
    admin: KeyPair
    proxy: KeyPair
    kubelet_client: KeyPair


@dataclass
class ControlPlane:
    """A local control plane. Use as a context manager, or call start() and stop()."""

    bin_dir: Path
    workdir: Path | None = None
    feature_gates: dict[str, bool] = field(default_factory=dict)
    extra_apiserver_args: list[str] = field(default_factory=list)
    # Merged into the KubeSchedulerConfiguration (e.g. percentageOfNodesToScore, profiles).
    scheduler_config: dict[str, Any] = field(default_factory=dict)
    start_timeout: float = 120.0
    # The ServiceAccount admission plugin: pods get their service account's token mounted,
    # as workloads installed by the chart need. Off by default: it refuses pods in a
    # namespace whose default service account the controller has not made yet.
    service_account_admission: bool = False

    def __post_init__(self) -> None:
        self._owns_workdir = self.workdir is None
        self.workdir = Path(self.workdir or tempfile.mkdtemp(prefix="composable-dra-cp-"))
        self._procs: list[BinaryProcess] = []
        self.api_port = 0
        self.scheduler_port = 0  # its secure port: /metrics, /debug/pprof
        self.kubeconfig = self.workdir / "admin.kubeconfig"
        self.ca: CertificateAuthority | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def logs_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "logs"

    def start(self) -> None:
        start_or_report(self._start, self.stop, self.logs_tail)

    def _start(self) -> None:
        """In order: certificates, etcd, the apiserver, the controller manager and the
        scheduler; each waited for until healthy."""
        assert self.workdir is not None
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        certs = self._certificates()
        etcd = self._start_etcd()
        self._start_apiserver(etcd, certs)
        self._start_controllers()

    def _certificates(self) -> _Certificates:
        """The CA, the apiserver's serving certificate, the admin's client certificate (and
        kubeconfig), the front-proxy client and the service-account key."""
        assert self.workdir is not None
        pki = self.workdir / "pki"
        ca = self.ca = CertificateAuthority(pki)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", "10.0.0.1"),
            server=True,
        )
        admin = ca.issue("admin", "admin", organizations=("system:masters",), client=True)
        # Front-proxy (aggregation) settings: without them the controller manager and the
        # scheduler complain, every few seconds, that the request-header CA is missing.
        proxy = ca.issue("front-proxy-client", "front-proxy-client", client=True)
        # What the API server shows a kubelet (which trusts this CA) to read a pod's log
        # or exec in it, as kubeadm's apiserver-kubelet-client: real nodes refuse anonymous.
        kubelet_client = ca.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=("system:masters",),
            client=True,
        )
        write_service_account_key(pki / "sa.key")
        self.api_port = free_port()
        self._write_kubeconfig(admin)
        return _Certificates(pki, serving, admin, proxy, kubelet_client)

    def _start_etcd(self) -> str:
        """etcd, healthy; its client URL."""
        assert self.workdir is not None
        client, peer = free_port(), free_port()
        self._spawn(
            "etcd",
            [
                "--name=local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{client}",
                f"--advertise-client-urls=http://127.0.0.1:{client}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=local=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",  # throwaway data: durability buys nothing here
                "--log-level=warn",
            ],
        )
        url = f"http://127.0.0.1:{client}"
        self._wait_http("etcd", f"{url}/health", None)
        return url

    def _start_apiserver(self, etcd: str, certs: _Certificates) -> None:
        assert self.ca is not None
        pki, ca_cert = certs.pki, self.ca.cert_path
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers={etcd}",
                # Every address: real nodes reach it from their own network namespaces
                # (testbed.node_network); it still advertises loopback, so no endpoint.
                "--bind-address=0.0.0.0",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={certs.serving.cert}",
                f"--tls-private-key-file={certs.serving.key}",
                f"--client-ca-file={ca_cert}",
                f"--requestheader-client-ca-file={ca_cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={certs.proxy.cert}",
                f"--proxy-client-key-file={certs.proxy.key}",
                f"--kubelet-client-certificate={certs.kubelet_client.cert}",
                f"--kubelet-client-key={certs.kubelet_client.key}",
                # Node names resolve nowhere here; a real node's InternalIP is reachable.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.key'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--disable-admission-plugins={','.join(self._disabled_admission())}",
                "--endpoint-reconciler-type=none",  # loopback is no valid endpoint address
                "--allow-privileged=true",
                "--profiling=false",
                f"--cert-dir={pki}",
                *self._gates_flag(),
                *self.extra_apiserver_args,
            ],
        )
        self._wait_http("kube-apiserver", f"{self.server}/readyz", certs.admin)

    def _disabled_admission(self) -> list[str]:
        off = ["TaintNodesByCondition"]
        return off if self.service_account_admission else ["ServiceAccount", *off]

    def _start_controllers(self) -> None:
        """The controller manager and the scheduler, both healthy."""
        assert self.workdir is not None and self.ca is not None
        pki = self.workdir / "pki"
        kcm_port, sched_port = free_port(), free_port()
        self.scheduler_port = sched_port
        common = [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            *self._gates_flag(),
        ]
        self._spawn(
            "kube-controller-manager",
            [
                *common,
                f"--secure-port={kcm_port}",
                "--controllers=*,-node-lifecycle-controller",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={self.ca.cert_path}",
                f"--cert-dir={pki / 'kcm'}",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                *[a for a in common if not a.startswith(("--kubeconfig", "--leader-elect"))],
                f"--config={self._scheduler_config()}",
                f"--secure-port={sched_port}",
                f"--cert-dir={pki / 'scheduler'}",
            ],
        )
        self._wait_http("kube-controller-manager", f"https://127.0.0.1:{kcm_port}/healthz", None)
        self._wait_http("kube-scheduler", f"https://127.0.0.1:{sched_port}/healthz", None)

    def _scheduler_config(self) -> Path:
        assert self.workdir is not None
        config = self.workdir / "scheduler.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                    "leaderElection": {"leaderElect": False},
                    # Short backoffs: a pod whose claim waits for a device is retried promptly.
                    "podInitialBackoffSeconds": 1,
                    "podMaxBackoffSeconds": 2,
                    **self.scheduler_config,
                }
            )
        )
        return config

    def stop(self) -> None:
        """Stop every process this control plane started, newest first.

        One at a time: the apiserver shuts down promptly only while etcd still answers.
        """
        for proc in reversed(self._procs):
            proc.stop(10)
        self._procs.clear()
        if (
            self._owns_workdir
            and self.workdir is not None
            and os.environ.get("KEEP_CONTROL_PLANE_DIR") is None
        ):
            shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self.stop)

    # -- clients -----------------------------------------------------------------------

    def api_client(self) -> ApiClient:
        """An admin client of the API server, for the kubernetes client's typed APIs."""
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kube(self, pool_size: int | None = None, user_agent: str | None = None) -> Kube:
        """An admin JSON client (composable_dra.k8s.kube); ``Kube.from_config``'s options."""
        return Kube.from_config(str(self.kubeconfig), pool_size=pool_size, user_agent=user_agent)

    # -- health and diagnostics ------------------------------------------------------

    def pid(self, name: str) -> int:
        """The process id of one of its binaries (``kube-scheduler``...)."""
        return next(p.popen.pid for p in self._procs if p.name == name)

    def check_alive(self) -> None:
        """Raise, with the logs, when a control plane process has exited."""
        names = exited(self._procs)
        if names:
            raise ControlPlaneError(f"control plane process exited: {names}\n{self.logs_tail()}")

    def logs_tail(self, lines: int = 40) -> str:
        return "\n".join(log_tails(self._procs, lines))

    # -- helpers ---------------------------------------------------------------------

    def _gates_flag(self) -> list[str]:
        if not self.feature_gates:
            return []
        value = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        return [f"--feature-gates={value}"]

    def _spawn(self, name: str, args: list[str]) -> None:
        argv = [str(self.bin_dir / name), *args]
        self._procs.append(BinaryProcess.spawn(name, argv, self.logs_dir / f"{name}.log"))

    def _wait_http(self, name: str, url: str, client: KeyPair | None) -> None:
        if url.startswith("https"):
            if client is not None and self.ca is not None:
                ctx = ssl.create_default_context(cafile=str(self.ca.cert_path))
                ctx.load_cert_chain(str(client.cert), str(client.key))
            else:
                # kube-controller-manager and kube-scheduler serve a self-signed
                # certificate of their own; only their liveness is checked here.
                ctx = ssl._create_unverified_context()  # noqa: S323
        else:
            ctx = None

        def healthy() -> bool:
            self.check_alive()
            with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # noqa: S310
                return bool(resp.status == 200)

        try:
            wait_for(healthy, self.start_timeout, f"{name} to be healthy at {url}", interval=0.2)
        except WaitTimeout as exc:
            cause = exc.__cause__
            if isinstance(cause, ControlPlaneError):
                raise cause from None
            raise ControlPlaneError(f"{exc} (last error: {cause})") from None

    def _write_kubeconfig(self, admin: KeyPair) -> None:
        assert self.ca is not None
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.ca.cert_path),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {"client-certificate": str(admin.cert), "client-key": str(admin.key)},
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
            "current-context": "local",
        }
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.kubeconfig.chmod(0o600)

    def describe(self) -> str:
        return textwrap.dedent(f"""\
            server:     {self.server}
            kubeconfig: {self.kubeconfig}
            logs:       {self.logs_dir}""")
