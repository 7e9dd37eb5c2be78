"""``composable-dra plugin``: the kubelet plugin of one node, wired together.

device source -> SourceWatcher -> SlicePublisher (the node's ResourceSlices)
                               -> Preparer <- PluginServer (registration, DRA v1/v1beta1)
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_driver.slices import LendPolicy

from composable_dra.lending.remote_leases import add_client_arguments
from composable_dra.model import names
from dra_driver.flags import Flags, env_flag, positive_seconds

DRIVER = names.DRIVER


# Long because it declares every flag of the plugin, grouped; it decides nothing. A flag
# named --x-y defaults to the environment variable X_Y (dra_driver.flags.env_flag).
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        required=os.environ.get("NODE_NAME") is None,
        help="this node (env NODE_NAME)",
    )
    env_flag(p, "--kubeconfig", help="in-cluster when unset")
    env_flag(p, "--driver-name", DRIVER)
    env_flag(p, "--plugins-registry-dir", "/var/lib/kubelet/plugins_registry", type=Path)
    env_flag(p, "--plugins-dir", "/var/lib/kubelet/plugins", type=Path)
    env_flag(p, "--cdi-dir", "/var/run/cdi", type=Path)
    env_flag(
        p,
        "--state-dir",
        "/var/lib/composable-dra/plugin",
        type=Path,
        help="where the checkpoint lives",
    )
    p.add_argument(
        "--boot-id-file",
        type=Path,
        default=Path("/proc/sys/kernel/random/boot_id"),
        help="a new boot id invalidates the checkpoint",
    )
    env_flag(p, "--device-source", "nvml", choices=["static", "redfish", "nvml"])
    env_flag(p, "--static-file", type=Path)
    env_flag(p, "--redfish-endpoint")
    env_flag(
        p,
        "--redfish-credentials-file",
        type=Path,
        help="YAML with username and password (else env REDFISH_USERNAME/REDFISH_PASSWORD)",
    )
    env_flag(p, "--redfish-ca-file", type=Path)
    p.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="seconds between device source reads (default: per source)",
    )
    env_flag(p, "--metrics-port", "0", type=int, help="0: off")
    env_flag(
        p,
        "--health-port",
        "0",
        type=int,
        help="gRPC health on TCP as well (0: only on the service socket)",
    )
    env_flag(
        p,
        "--health-interval",
        "2",
        type=float,
        help="seconds between reads of the devices' health sources (env HEALTH_INTERVAL)",
    )
    env_flag(
        p,
        "--health-resend",
        "10",
        type=positive_seconds,
        help="seconds between resends of an unchanged health stream to the kubelet, which "
        "calls a device Unknown after three without one (env HEALTH_RESEND)",
    )
    env_flag(
        p,
        "--lease-refresh-interval",
        "1",
        type=float,
        help="seconds between reads of the prepared remote GPUs' claims for a lease the "
        "controller re-opened after its donor restarted (env LEASE_REFRESH_INTERVAL)",
    )
    env_flag(
        p,
        "--health-recover-after",
        "3",
        type=int,
        help="healthy reads in a row before an unhealthy device is healthy again "
        "(env HEALTH_RECOVER_AFTER)",
    )
    p.add_argument(
        "--nvml-health",
        action="store_true",
        default=os.environ.get("NVML_HEALTH", "").lower() in {"1", "true", "yes"},
        help="judge the GPUs' health by NVML (XID, ECC, GPU lost) with another device "
        "source too, e.g. redfish on a host with the NVIDIA driver (env NVML_HEALTH=true; "
        "the nvml source always does)",
    )
    env_flag(
        p,
        "--host-rescan-command",
        help="run before looking for a device the fabric just attached, e.g. "
        "\"sh -c 'echo 1 > /sys/bus/pci/rescan'\" (default: just read the source again)",
    )
    env_flag(
        p,
        "--host-release-command",
        help="run before the fabric detaches a device, once no process uses it, e.g. "
        "\"sh -c 'echo 1 > /sys/bus/pci/devices/$COMPOSABLE_DRA_PCI_BUS_ID/remove'\" "
        "(env: COMPOSABLE_DRA_DEVICE_UUID, COMPOSABLE_DRA_PCI_BUS_ID, COMPOSABLE_DRA_RESOURCE;"
        " default: only wait for the device's processes to end)",
    )
    lend = p.add_argument_group(
        "lending (remote GPUs; default off)",
        "publish, beside each local GPU, a remote-lease device other nodes may be allocated",
    )
    lend.add_argument(
        "--lend",
        action="store_true",
        default=os.environ.get("LEND", "").lower() in {"1", "true", "yes"},
        help="lend this node's published GPUs (env LEND=true)",
    )
    env_flag(
        lend,
        "--network-domain",
        help="this node's network domain (env NETWORK_DOMAIN; default: the node's label "
        "composable.dra.io/network-domain)",
    )
    env_flag(
        lend,
        "--link-gbps",
        type=int,
        help="the donor link's speed in Gbit/s (env LINK_GBPS; required with --lend)",
    )
    env_flag(
        lend,
        "--max-leases",
        type=int,
        help="concurrent leases the link carries before it congests, its knee "
        "(env MAX_LEASES; required with --lend)",
    )
    env_flag(
        lend,
        "--lend-transports",
        "tcp",
        help="comma-separated: tcp, ucx (env LEND_TRANSPORTS; default tcp)",
    )
    env_flag(
        lend,
        "--borrowers",
        "",
        help="node labels key=value[,key=value] a borrower must have (env BORROWERS; "
        "default: every other node in the same network domain)",
    )
    _add_lend_status_arguments(lend)
    add_client_arguments(p, "plugin", token_file=True)
    p.add_argument(
        "--no-fsync",
        action="store_true",
        help="skip fsync of CDI specs and the checkpoint (tests and benchmarks only)",
    )
    _add_rolling_update_arguments(p)


def _add_lend_status_arguments(lend: Flags) -> None:
    env_flag(
        lend,
        "--donor-status-interval",
        "5",
        type=float,
        help="seconds between reads of this node's donor status (link load, SLO lease "
        "capacity; needs --lease-token-file; 0: off; env DONOR_STATUS_INTERVAL)",
    )
    lend.add_argument(
        "--link-busy-at",
        type=float,
        default=0.7,
        help="link load (share of its capacity) at which the remote devices get the "
        "composable.dra.io/link-busy NoSchedule taint",
    )
    lend.add_argument(
        "--link-clear-at",
        type=float,
        default=0.5,
        help="link load below which the taint comes off again (hysteresis)",
    )
    env_flag(
        lend,
        "--host-slowdown-at-full",
        type=float,
        help="this host's interference profile: how much longer a job runs beside GPU "
        "traffic that fills the host (0.2: 20%%); publishes the QoS attributes hostSlowdown, "
        "hostHeadroom and linkLoad from the donor status (docs/lending-policy.md; unset: "
        "off; env HOST_SLOWDOWN_AT_FULL)",
    )
    env_flag(
        lend,
        "--host-bandwidth",
        type=float,
        help="bytes/s this host's PCIe and memory carry for GPU traffic, what the host "
        "load is a share of (required with --host-slowdown-at-full; env HOST_BANDWIDTH)",
    )


def _add_rolling_update_arguments(p: argparse.ArgumentParser) -> None:
    env_flag(
        p,
        "--rolling-update-uid",
        "",
        env="POD_UID",
        help="this plugin pod's UID (env POD_UID, from the downward API): sockets named with"
        " it let an old and a new instance run side by side during a DaemonSet rolling update"
        " (needs kubelet 1.33 or later); empty: fixed socket names",
    )


def lend_policy(args: argparse.Namespace, node: dict[str, Any]) -> LendPolicy | None:
    """The lending policy from flags and the node's labels; None when lending is off.

    Raises SystemExit with the reason when the flags do not make a policy.
    """
    from dra_driver.slices import NETWORK_DOMAIN_LABEL, LendPolicy, LendPolicyError

    if not args.lend:
        return None
    labels = (node.get("metadata") or {}).get("labels") or {}
    domain = args.network_domain or labels.get(NETWORK_DOMAIN_LABEL)
    if not domain:
        raise SystemExit(f"--lend needs --network-domain or the node label {NETWORK_DOMAIN_LABEL}")
    for flag, value in (("--link-gbps", args.link_gbps), ("--max-leases", args.max_leases)):
        if value is None:
            raise SystemExit(f"--lend needs {flag}")
    try:
        return LendPolicy(
            network_domain=domain,
            link_gbps=int(args.link_gbps),
            max_leases=int(args.max_leases),
            transports=tuple(t.strip() for t in args.lend_transports.split(",") if t.strip()),
            borrowers=LendPolicy.parse_borrowers(args.borrowers),
        )
    except (LendPolicyError, ValueError) as exc:
        raise SystemExit(f"lending policy: {exc}") from None


def _make_source(args: argparse.Namespace, node: dict[str, Any]) -> Any:
    kw: dict[str, Any] = {}
    if args.poll_interval is not None:
        kw["poll_interval"] = args.poll_interval
    if args.device_source == "static":
        if args.static_file is None:
            raise SystemExit("--static-file is required with --device-source static")
        from dra_driver.sources.static import StaticSource

        return StaticSource(args.static_file, **kw)
    if args.device_source == "redfish":
        if not args.redfish_endpoint:
            raise SystemExit("--redfish-endpoint is required with --device-source redfish")
        from dra_driver.sources.redfish import QUICK, RedfishSource, load_credentials

        system_uuid = ((node.get("status") or {}).get("nodeInfo") or {}).get("systemUUID")
        if not system_uuid:
            raise SystemExit(f"node {args.node_name} reports no systemUUID")
        ca = args.redfish_ca_file
        return RedfishSource(
            args.redfish_endpoint,
            system_uuid,
            credentials=load_credentials(args.redfish_credentials_file),
            connection=replace(QUICK, ca_file=str(ca) if ca else None),
            **kw,
        )
    from dra_driver.sources.nvml import NvmlSource

    return NvmlSource(**kw)


# Long because it is the plugin's composition root: it builds each part and wires them; what they
# decide lives in the parts, so splitting this would only scatter the wiring.
def run(args: argparse.Namespace) -> int:
    from composable_dra.k8s.kube import Kube, path
    from composable_dra.process import logs, metrics
    from dra_driver.cdi import CdiWriter
    from dra_driver.checkpoint import Checkpoint, read_boot_id
    from dra_driver.claim_reader import ClaimReader
    from dra_driver.grpc_server import InvalidUID, PluginServer, check_uid
    from dra_driver.prepare import Preparer
    from dra_driver.slices import SlicePublisher

    log = logs.get(__name__, node=args.node_name)
    try:
        rolling_update_uid = check_uid(args.rolling_update_uid)
    except InvalidUID as exc:
        raise SystemExit(str(exc)) from None
    kube = Kube.from_config(args.kubeconfig, user_agent="composable-dra/plugin")
    node = kube.get(path("v1", "nodes", args.node_name))

    durable = not args.no_fsync
    checkpoint = Checkpoint(
        args.state_dir / "checkpoint.json", read_boot_id(args.boot_id_file), durable=durable
    )
    lend = lend_policy(args, node)
    taints = _check_api(args, kube, lend is not None, log)
    publisher = SlicePublisher(
        kube, args.node_name, node["metadata"]["uid"], args.driver_name, lend=lend, taints=taints
    )
    client = _lease_client(args)
    source = _make_source(args, node)
    watcher, visibility, resources = _device_side(args, kube, publisher, source)
    preparer = Preparer(
        args.driver_name,
        args.node_name,
        ClaimReader(kube),
        lambda: watcher.devices,
        checkpoint,
        CdiWriter(args.cdi_dir, durable=durable),
        remote=_remote_leases(args, client, durable),
    )
    poller = (
        _donor_status(args, client, publisher, lend, source, preparer.held)
        if lend is not None
        else None
    )
    loops = [p for p in (poller, _lease_refresher(args, kube, preparer)) if p is not None]
    board, feed = _health_side(args, kube, node, (source, resources), watcher, publisher, preparer)
    server = PluginServer(
        preparer,
        args.driver_name,
        args.plugins_registry_dir,
        args.plugins_dir,
        health_port=args.health_port,
        rolling_update_uid=rolling_update_uid,
        health_feed=feed,
        health_resend=args.health_resend,
    )

    stop = _stop_on_signal(log)
    metrics.serve(args.metrics_port)
    watcher.start()
    visibility.start()
    publisher.start()
    for loop in loops:
        loop.start()
    board.start(args.health_interval)
    server.start()
    log.info(
        "plugin started",
        driver=args.driver_name,
        source=args.device_source,
        lending=lend is not None,
        prepared_claims=len(checkpoint.claims),
    )
    try:
        stop.wait()
    finally:
        server.stop()
        board.stop()
        watcher.stop()
        visibility.stop()
        for loop in loops:
            loop.stop()
        publisher.stop()
    return 0


def _check_api(args: argparse.Namespace, kube: Any, lending: bool, log: Any) -> bool:
    """What the API server serves of what this plugin writes (its slices' taints and, when
    lending, per-device slices with binding conditions): one log line and the metric;
    SystemExit naming what is missing when lending is asked of a server without it.
    Whether the server keeps device taints."""
    from composable_dra.k8s.feature_probe import Probes, check_at_start
    from composable_dra.k8s.features import Feature

    probes = Probes(args.driver_name, node=args.node_name, slices=True, partitions=lending)
    found = check_at_start(kube, probes, ["lending (--lend)"] if lending else [], log, "plugin")
    return Feature.DEVICE_TAINTS in found.present


def _device_side(
    args: argparse.Namespace, kube: Any, publisher: Any, source: Any
) -> tuple[Any, Any, Any]:
    """The watcher of the node's devices and the DeviceVisible reporter.

    Devices serving a pool allocation keep their pool identity: the gate decides what the
    node's slices publish (nothing until it knows the node's resources). One watch on the
    node's ComposableResources feeds it and the DeviceVisible reporter.
    """
    from dra_driver.device_source import DeviceInfo, SourceWatcher
    from dra_driver.device_visibility import VisibilityReporter
    from dra_driver.host_release import HostReleaser
    from dra_driver.publish_once import LocalSliceGate, node_resources

    wake = threading.Event()
    resources = node_resources(kube, args.node_name, wake.set)
    gate: LocalSliceGate | None = None

    def publish(_devices: list[DeviceInfo]) -> None:
        if gate is not None:
            gate.republish()

    watcher = SourceWatcher(source, publish)
    gate = LocalSliceGate(
        kube,
        args.node_name,
        resources,
        devices=lambda: watcher.devices,
        publish=lambda out: publisher.set_devices(
            out, keep=gate.fabric_uuids if gate is not None else frozenset()
        ),
        read_devices=watcher.read_now,
    )
    visibility = VisibilityReporter(
        kube,
        args.node_name,
        resources,
        wake,
        devices=lambda: watcher.devices,
        refresh=watcher.poll_once,
        republish=gate.republish,
        host_step=args.host_rescan_command,
        releaser=HostReleaser(
            kube,
            args.node_name,
            devices=lambda: watcher.devices,
            refresh=watcher.poll_once,
            processes=getattr(source, "processes", None),
            command=args.host_release_command,
        ),
    )
    return watcher, visibility, resources


def _health_side(
    args: argparse.Namespace,
    kube: Any,
    node: dict[str, Any],
    inputs: tuple[Any, Any],
    watcher: Any,
    publisher: Any,
    preparer: Any,
) -> tuple[Any, Any]:
    """The health board over the node's health sources (the device source, where it judges
    health; the manual fence on the node's ComposableResources; the donors of the remote
    GPUs prepared here) and the kubelet's health stream it feeds."""
    from dra_driver import health_stream
    from dra_driver.fence_source import FenceSource
    from dra_driver.health_effects import HealthEffects
    from dra_driver.health_sources import HealthBoard

    source, resources = inputs
    sources = [source] if hasattr(source, "reports") else []
    if args.nvml_health and args.device_source != "nvml":
        from dra_driver.sources.nvml_health import NvmlHealth

        sources.append(NvmlHealth())
    sources.append(FenceSource(resources.items, lambda: watcher.devices))
    if args.lease_token_file:  # remote GPUs prepared here: their donors' health
        from dra_driver.claim_reader import ClaimReader
        from dra_driver.donor_health import DonorHealthSource

        sources.append(
            DonorHealthSource(args.driver_name, preparer.prepared_claims, ClaimReader(kube))
        )

    def names() -> list[str]:
        return [d.name for d in watcher.devices]

    board = HealthBoard(sources, names, recover_after=args.health_recover_after)
    feed = health_stream.HealthFeed(
        lambda: health_stream.entries(
            args.node_name, names(), board.states(), preparer.prepared_devices()
        )
    )
    board.on_change(HealthEffects(kube, node, publisher.set_health, feed.changed))
    preparer.listeners.append(feed.changed)
    return board, feed


def _stop_on_signal(log: Any) -> threading.Event:
    """An event that SIGTERM and SIGINT set."""
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return stop


def _lease_client(args: argparse.Namespace) -> Any:
    """The donors' lease APIs, with this pod's projected token (bound to the pod, so to
    this node); None without ``--lease-token-file``."""
    if not args.lease_token_file:
        return None
    from composable_dra.lending.remote_leases import client_from_args

    return client_from_args(args)


def _lease_refresher(args: argparse.Namespace, kube: Any, preparer: Any) -> Any:
    """The loop that writes re-opened leases into the prepared claims' lease directories;
    None without ``--lease-token-file`` (no remote GPUs here)."""
    if not args.lease_token_file:
        return None
    from dra_driver.claim_reader import ClaimReader
    from dra_driver.lease_refresh import LeaseRefresher

    return LeaseRefresher(
        args.driver_name,
        preparer.prepared_claims,
        ClaimReader(kube),
        preparer.refresh_remote,
        args.lease_refresh_interval,
    )


def _remote_leases(args: argparse.Namespace, client: Any, durable: bool) -> Any:
    """Credentials of remote GPUs, collected from donors; None without a lease client
    (remote devices then fail to prepare)."""
    if client is None:
        return None
    from dra_driver.remote_prepare import RemoteLeases

    return RemoteLeases(client, args.state_dir / "remote-gpu", durable=durable)


def _qos_sampling(args: argparse.Namespace, source: Any, held: Any) -> Any:
    """What the poller needs for the QoS attributes; None without
    ``--host-slowdown-at-full``. SystemExit on a profile that cannot work."""
    from composable_dra.lending import qos
    from dra_driver.lend_status import QosSampling

    if args.host_slowdown_at_full is None:
        return None
    if args.host_bandwidth is None:
        raise SystemExit("--host-slowdown-at-full needs --host-bandwidth")
    try:
        return QosSampling(
            host=qos.HostProfile(args.host_slowdown_at_full),
            host_bandwidth=args.host_bandwidth,
            pcie=getattr(source, "pcie_bytes_per_second", None),
            held=held,
        )
    except qos.ProfileError as exc:
        raise SystemExit(f"--host-slowdown-at-full/--host-bandwidth: {exc}") from None


def _donor_status(
    args: argparse.Namespace,
    client: Any,
    publisher: Any,
    lend: Any,
    source: Any = None,
    held: Any = None,
) -> Any:
    """The poller of this node's donor status (lending on); None when off or without a
    lease client. SystemExit on thresholds that cannot work."""
    from composable_dra.lending import netaware
    from dra_driver.lend_status import DonorStatusPoller

    try:
        rule = netaware.LinkBusyRule(busy_at=args.link_busy_at, clear_at=args.link_clear_at)
    except netaware.PolicyError as exc:
        raise SystemExit(f"--link-busy-at/--link-clear-at: {exc}") from None
    sampling = _qos_sampling(args, source, held)
    if client is None or args.donor_status_interval <= 0:
        return None
    return DonorStatusPoller(
        client,
        args.node_name,
        publisher.set_lend_state,
        rule,
        args.donor_status_interval,
        knee=lend.max_leases,
        sampling=sampling,
    )
