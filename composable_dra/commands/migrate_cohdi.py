"""``composable-dra migrate-cohdi FILE``: CoHDI ComposabilityRequests to ours.

Reads CoHDI's ``cro.hpsys.ibm.ie.com/v1alpha1`` ComposabilityRequests (one YAML document,
several, or a ``List`` as ``kubectl get -o yaml`` writes it) and writes ours
(``composable.dra.io/v1alpha1``). What we cannot honour is refused, every reason at once
and nothing written, so no request is half-migrated; docs/operations.md has the mapping
(``cohdi.py``). The file is read without YAML aliases (``safe_yaml.py``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="CoHDI YAML ('-' reads standard input)")
    parser.add_argument("--fabric", required=True, help="the Fabric the requests draw from")
    parser.add_argument(
        "--spread",
        action="store_true",
        help="accept allocation_policy differentnode as our spread (not a guarantee)",
    )
    parser.add_argument("-o", "--output", help="write here instead of standard output")


def run(args: argparse.Namespace) -> int:
    import yaml  # heavy imports here: cli imports this module to declare its flags

    from composable_dra.commands import safe_yaml
    from composable_dra.commands.cohdi import MigrationError, convert_all

    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text("utf-8")
        converted = convert_all(safe_yaml.load_all(text), args.fabric, spread=args.spread)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"migrate-cohdi: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    except yaml.YAMLError as exc:
        print(f"migrate-cohdi: {args.file} is not YAML: {exc}", file=sys.stderr)
        return 2
    except MigrationError as exc:
        print("migrate-cohdi: nothing written; cannot migrate:", file=sys.stderr)
        for reason in exc.reasons:
            print(f"  - {reason}", file=sys.stderr)
        return 1
    out = yaml.safe_dump_all(converted, sort_keys=False)
    if args.output:
        Path(args.output).write_text(out, encoding="utf-8")
    else:
        sys.stdout.write(out)
    return 0
