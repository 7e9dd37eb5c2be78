"""The Fsas FM emulator's settings and command-line flags (light: no server imports)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass
class FsasConfig:
    tenant: str = "tenant-0001"
    realm: str = "cdi"
    client_id: str = "composable-dra"
    client_secret: str = "fsas-secret"  # noqa: S105 - the emulator's documented default
    token_seconds: int = 300
    # As CoHDI's CI mock of the FM (CoHDI/cohdi-ci-mock app.py) behaves, where it differs
    # from what the fsas-fm backend assumes (docs/fabrics.md, "Assumptions"): the FM picks
    # the GPU of the model (a res_uuid condition is ignored), and no resources endpoints.
    attach_by_model: bool = False
    list_resources: bool = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fsas", action="store_true", help="also serve the Fsas CDI fabric manager API"
    )
    parser.add_argument("--fsas-tenant", default=FsasConfig.tenant, help="the FM's tenant UUID")
    parser.add_argument("--fsas-realm", default=FsasConfig.realm, help="the ID manager's realm")
    parser.add_argument("--fsas-client-id", default=FsasConfig.client_id)
    parser.add_argument(
        "--fsas-client-secret-file",
        help=f"file holding the OAuth client's secret (default: {FsasConfig.client_secret})",
    )
    parser.add_argument(
        "--fsas-token-seconds", type=int, default=FsasConfig.token_seconds, help="token lifetime"
    )
    parser.add_argument(
        "--fsas-attach-by-model",
        action="store_true",
        help="attach the first free GPU of the model, ignoring a res_uuid condition (as "
        "CoHDI's CI mock of the FM does)",
    )
    parser.add_argument(
        "--fsas-no-resource-list",
        action="store_true",
        help="serve no resources endpoints (as CoHDI's CI mock of the FM)",
    )


def config_from(args: argparse.Namespace) -> FsasConfig:
    secret = FsasConfig.client_secret
    if args.fsas_client_secret_file:
        secret = Path(args.fsas_client_secret_file).read_text(encoding="utf-8").strip()
    return FsasConfig(
        args.fsas_tenant,
        args.fsas_realm,
        args.fsas_client_id,
        secret,
        args.fsas_token_seconds,
        attach_by_model=args.fsas_attach_by_model,
        list_resources=not args.fsas_no_resource_list,
    )


def process_args(workdir: Path, config: FsasConfig) -> list[str]:
    """``EmulatorProcess(extra_args=...)`` for an emulator that serves the FM API too."""
    secret = workdir / "fsas-client-secret"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text(config.client_secret, encoding="utf-8")
    secret.chmod(0o600)
    return [
        "--fsas",
        f"--fsas-tenant={config.tenant}",
        f"--fsas-realm={config.realm}",
        f"--fsas-client-id={config.client_id}",
        f"--fsas-client-secret-file={secret}",
        f"--fsas-token-seconds={config.token_seconds}",
        *(["--fsas-attach-by-model"] if config.attach_by_model else []),
        *([] if config.list_resources else ["--fsas-no-resource-list"]),
    ]
