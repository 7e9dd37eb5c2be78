"""``composable-dra fabric-emulator``: a stateful Redfish composition service to test against.

Serves the Redfish tree under ``/redfish/v1`` and an admin API under ``/admin`` (see
README.md, "Fabric emulator"). Logs the base URL once listening and, with
``--ready-file``, writes it there (atomically) so other processes can wait on it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from fabric_emulator.fsas import config as fsas_config
from fabric_emulator.limits import PAGE_SIZE_MAX, SETTING_MAX
from fabric_emulator.query import DEFAULT_PAGE_SIZE


def _bounded(setting: str, low: int = 0) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to the setting's maximum (as
    /admin/config)."""
    top = PAGE_SIZE_MAX if setting == "page_size" else SETTING_MAX[setting]

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= top:
            raise argparse.ArgumentTypeError(f"must be from {low} to {top}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    parser.add_argument("--topology", help="topology file (YAML or JSON); default: built-in")
    parser.add_argument("--user", default="admin", help="the account's user name")
    parser.add_argument(
        "--password-file",
        help="file holding the account's password (default password: admin)",
    )
    parser.add_argument(
        "--async-polls",
        type=_bounded("async_polls"),
        default=0,
        help="0: composition changes answer at once; N: 202 and a task that completes "
        "after N polls",
    )
    parser.add_argument(
        "--retry-after",
        type=_bounded("retry_after"),
        default=1,
        help="Retry-After seconds on 202",
    )
    parser.add_argument(
        "--task-seconds",
        type=_bounded("task_seconds"),
        default=10,
        help="a task also ends on its own this long after it started, polled or not",
    )
    parser.add_argument(
        "--page-size",
        type=_bounded("page_size", 1),
        default=DEFAULT_PAGE_SIZE,
        help="the most members one response of a collection holds; the rest is behind "
        "Members@odata.nextLink",
    )
    parser.add_argument("--faults", help="JSON or YAML file with a list of fault rules")
    parser.add_argument("--state-file", help="keep the composition in this file across restarts")
    parser.add_argument("--ready-file", help="write the base URL here once listening")
    parser.add_argument(
        "--host-state-dir",
        help="the hosts' PCIe side, shared with them (fake NVML, release command): a block "
        "removed while its host holds it is counted as a surprise removal",
    )
    parser.add_argument(
        "--admin-token-file",
        help="file holding a token that the /admin API then requires as a Bearer token "
        "(default: the admin API is open, for a laptop only)",
    )
    fsas_config.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib

    import yaml

    from composable_dra.process import logs
    from fabric_emulator import faults, persistence, server, topology

    log = logs.get(__name__)
    try:
        topo = topology.load(args.topology) if args.topology else topology.default()
    except (OSError, topology.TopologyError) as exc:
        log.error("bad topology", error=str(exc))
        return 2
    password = server.DEFAULT_PASSWORD
    if args.password_file:
        password = Path(args.password_file).read_text(encoding="utf-8").strip()
    rules = faults.Faults()
    if args.faults:
        try:
            rules.replace(yaml.safe_load(Path(args.faults).read_text(encoding="utf-8")) or [])
        except (OSError, yaml.YAMLError, faults.FaultError) as exc:
            log.error("bad fault rules", error=str(exc))
            return 2
    config = server.Config(
        user=args.user,
        password=password,
        async_polls=args.async_polls,
        retry_after=args.retry_after,
        task_seconds=args.task_seconds,
        page_size=args.page_size,
        state_file=Path(args.state_file) if args.state_file else None,
        host_state_dir=Path(args.host_state_dir) if args.host_state_dir else None,
        admin_token=(
            Path(args.admin_token_file).read_text(encoding="utf-8").strip() or None
            if args.admin_token_file
            else None
        ),
    )
    if args.fsas:  # the Fsas FM API beside Redfish, on the same composition
        from fabric_emulator.fsas import server as fsas_server

        emulator: server.Emulator = fsas_server.FsasEmulator(
            topo, config, rules, fsas_config.config_from(args)
        )
    else:
        emulator = server.Emulator(topo, config, rules)

    async def serve() -> None:
        runner, url = await server.start(emulator, args.host, args.port)
        log.info(
            "fabric emulator listening",
            url=url,
            hosts=len(topo.hosts),
            zones=len(topo.zones),
            blocks=len(topo.blocks),
        )
        if args.ready_file:
            persistence.save_text(args.ready_file, url + "\n")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0
