"""``composable-dra remote-gpu-donor``: serve this node's GPU to leases on other nodes."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

from composable_dra.model import names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="donor name the lease tokens must carry")
    parser.add_argument("--secret-file", type=Path, required=True, help="HMAC key for tokens")
    parser.add_argument("--listen", default="0.0.0.0:7470", help="host:port for TCP")
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="NAME=MODULE:FUNCTION",
        help="a function clients may call (repeatable); NAME defaults to the import path",
    )
    parser.add_argument("--memory-quota", type=int, default=256 << 20, help="bytes per lease")
    parser.add_argument("--credits", type=int, default=4, help="max requests in flight")
    parser.add_argument("--rate-limit", type=float, default=0.0, help="invocations/s per lease")
    parser.add_argument("--rate-burst", type=float, default=16.0)
    parser.add_argument("--link-bandwidth", type=float, help="link bytes/s for admission")
    parser.add_argument(
        "--measure-link",
        metavar="ADDR",
        help="measure the bandwidth to a sink on ADDR at start, for admission control",
    )
    parser.add_argument("--headroom", type=float, default=0.9, help="usable share of the link")
    parser.add_argument("--transports", default="shm,tcp", help="offered transports")
    parser.add_argument(
        "--spin-us",
        "--ring-spin-us",
        dest="spin_us",
        type=float,
        default=250.0,
        help="how long a lease's worker watches for the next request (its ring, or its TCP "
        "connection) before it sleeps",
    )
    parser.add_argument(
        "--handshake-timeout",
        type=float,
        default=10.0,
        help="seconds a new connection has to authenticate (HELLO) before it is dropped; on "
        "the lease API, to complete its TLS handshake and a request's headers",
    )
    parser.add_argument(
        "--max-connections-per-peer",
        type=int,
        default=64,
        help="connections one peer address may hold to the data plane, and to the lease API "
        "(and never more than half the process's connection budget in all)",
    )
    parser.add_argument("--ucx-port", type=int, help="also listen for UCX on this port")
    parser.add_argument(
        "--backend",
        choices=("auto", "numpy", "cupy", "torch"),
        default=None,
        help="where functions with a GPU kernel run (default: $REMOTE_GPU_BACKEND or auto: "
        "the GPU when CuPy or PyTorch sees one; numpy forces numpy)",
    )
    parser.add_argument("--metrics-port", type=int, default=0, help="Prometheus port (0: off)")
    _add_lending_arguments(parser)
    _add_lease_api_arguments(parser)


def _add_lending_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "lending policy",
        "what the donor measures for the link-busy taint and SLO admission "
        "(docs/lending-policy.md); the link's capacity is --link-bandwidth",
    )
    g.add_argument(
        "--status-window",
        type=float,
        default=10.0,
        help="seconds over which the link's load is measured (a moving window)",
    )
    g.add_argument(
        "--latency-model",
        action="append",
        default=[],
        metavar="NAME=SECONDS[:GROWTH]",
        help="a function's latency per call alone, and its growth per extra concurrent "
        "lease (default: the same, time slicing), used until the donor has measured it "
        "(repeatable)",
    )


def _add_lease_api_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group(
        "lease API", "open leases for allocated remote devices (docs/operations.md, Remote GPUs)"
    )
    g.add_argument("--lease-api-listen", metavar="HOST:PORT", help="serve it here (unset: off)")
    g.add_argument("--lease-api-cert", help="its TLS certificate (PEM)")
    g.add_argument("--lease-api-key", help="its TLS key (PEM)")
    g.add_argument("--node-name", help="the donor's node, its pool's name (default: --name)")
    g.add_argument("--advertise", metavar="HOST:PORT", help="the data endpoint leases name")
    g.add_argument("--kubeconfig", help="for TokenReviews and claim reads (default: in-cluster)")
    g.add_argument("--driver-name", default=names.DRIVER)
    g.add_argument(
        "--lease-controller-sa",
        metavar="NAMESPACE/NAME",
        help="the lease controller's service account: it alone opens and lists leases",
    )
    g.add_argument(
        "--lease-plugin-sa",
        metavar="NAMESPACE/NAME",
        help="the plugins' service account: a consumer node's plugin collects its credentials "
        "with its pod's token (bound to a pod on that node)",
    )
    g.add_argument("--lease-ttl", type=float, default=86400.0, help="seconds a lease's token lives")


def parse_allow(items: list[str]) -> dict[str, str]:
    allow: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        allow[name if sep else item] = path if sep else item
    return allow


def lending_monitor(
    args: argparse.Namespace, bandwidth: float | None, allow: dict[str, str]
) -> Any:
    """The donor's measurements for the lending policy; SystemExit on a bad flag."""
    from remote_gpu.lending import LendingMonitor
    from remote_gpu.measure import parse_model

    try:
        priors = dict(parse_model(item) for item in args.latency_model)
        return LendingMonitor(bandwidth, args.status_window, priors, functions=allow)
    except ValueError as exc:
        raise SystemExit(f"remote-gpu-donor: {exc}") from None


def donor_config(
    args: argparse.Namespace, bandwidth: float, allow: dict[str, str], monitor: Any
) -> Any:
    """The data plane's settings from the flags (the link's bandwidth as measured)."""
    from remote_gpu.donor import DonorConfig
    from remote_gpu.tokens import read_secret

    return DonorConfig(
        name=args.name,
        secret=read_secret(args.secret_file),
        allow=allow,
        memory_quota=args.memory_quota,
        max_credits=args.credits,
        rate_limit=args.rate_limit,
        rate_burst=args.rate_burst,
        link_bandwidth=bandwidth,
        headroom=args.headroom,
        transports=tuple(t.strip() for t in args.transports.split(",") if t.strip()),
        spin=args.spin_us * 1e-6,
        handshake_timeout=args.handshake_timeout,
        max_connections_per_peer=args.max_connections_per_peer,
        monitor=monitor,
    )


def run(args: argparse.Namespace) -> int:
    import asyncio
    import dataclasses

    from composable_dra.process import logs, metrics
    from remote_gpu import backends
    from remote_gpu.admission import measure_bandwidth
    from remote_gpu.donor import Donor

    log = logs.get(__name__)
    if args.backend:
        # The lease workers read it (they start from this process's environment).
        os.environ[backends.ENV] = args.backend
    try:
        gpu = backends.from_env()  # checked here: a forced backend without a GPU stops it
    except backends.BackendError as exc:
        raise SystemExit(f"remote-gpu-donor: {exc}") from None
    log.info("function backend", backend=gpu.name if gpu else "numpy")
    bandwidth = args.link_bandwidth
    if args.measure_link:
        bandwidth = measure_bandwidth(args.measure_link)
        log.info("measured link", bandwidth_bps=round(bandwidth))
    allow = parse_allow(args.allow)
    monitor = lending_monitor(args, bandwidth, allow)
    config = donor_config(args, bandwidth, allow, monitor)
    metrics.serve(args.metrics_port)
    host, _, port = args.listen.rpartition(":")
    leases = _lease_api(args, config, monitor) if args.lease_api_listen else None

    async def main() -> None:
        donor = Donor(config)
        await donor.start(host.strip("[]"), int(port))
        runner = None
        if leases is not None:
            from remote_gpu.lease_api import LIMITS, serve

            api, tls = leases
            api.set_on_close(donor.revoke)
            api_host, _, api_port = args.lease_api_listen.rpartition(":")
            # The data plane's bounds (per peer, the time to a complete request) hold
            # for the lease API too; the process's connection budget is shared.
            limits = dataclasses.replace(
                LIMITS,
                per_peer=config.max_connections_per_peer,
                header_timeout=config.handshake_timeout,
            )
            runner, _ = await serve(api, api_host.strip("[]"), int(api_port), tls, limits)
        listener = None
        if args.ucx_port:
            from remote_gpu.transports.ucx import listen

            # Held for the donor's lifetime: a dropped listener stops accepting.
            listener = await listen(donor, args.ucx_port)
            log.info("ucx listening", port=args.ucx_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        if runner is not None:
            await runner.cleanup()
        # End every lease: workers stopped, arenas and doorbells removed from /dev/shm.
        await donor.close()
        del listener

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


def _lease_api(args: argparse.Namespace, config: Any, monitor: Any) -> Any:
    """The lease API over a fresh book (a restarted donor has no leases); its data plane
    then admits only the leases the API opened."""
    from composable_dra.k8s.kube import Kube
    from composable_dra.lending.remote_leases import parse_service_account
    from remote_gpu.identity import service_account_user
    from remote_gpu.lease_api import (
        KubeReviewer,
        LeaseAPI,
        LeaseAPIConfig,
        LeaseBook,
        server_context,
    )

    missing = [
        flag
        for flag, value in (
            ("--lease-api-cert", args.lease_api_cert),
            ("--lease-api-key", args.lease_api_key),
            ("--lease-controller-sa", args.lease_controller_sa),
            ("--lease-plugin-sa", args.lease_plugin_sa),
        )
        if not value
    ]
    if missing:
        raise SystemExit(f"--lease-api-listen needs {', '.join(missing)}")
    host = args.listen.rpartition(":")[0].strip("[]")
    endpoint = args.advertise or (None if host in ("", "0.0.0.0", "::") else args.listen)
    if endpoint is None:
        raise SystemExit("--lease-api-listen with a wildcard --listen needs --advertise")
    try:
        controller = service_account_user(*parse_service_account(args.lease_controller_sa))
        plugin = service_account_user(*parse_service_account(args.lease_plugin_sa))
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    kube = Kube.from_config(args.kubeconfig, user_agent="composable-dra/remote-gpu-donor")
    reviewer = KubeReviewer(kube)
    book = LeaseBook(config.name, endpoint, config.secret, args.lease_ttl)
    config.lease_gate = book.is_open
    api = LeaseAPI(
        LeaseAPIConfig(args.node_name or args.name, args.driver_name, controller, plugin),
        book,
        reviewer,
        reviewer,
        monitor=monitor,
    )
    return api, server_context(args.lease_api_cert, args.lease_api_key)
