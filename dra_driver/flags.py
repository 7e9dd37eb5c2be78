"""The plugin's flags whose defaults come from the environment (its DaemonSet's env)."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any, Protocol


class Flags(Protocol):
    """A parser or one of its argument groups."""

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action: ...


def env_flag(
    parser: Flags,
    flag: str,
    default: str | None = None,
    *,
    env: str | None = None,
    **kwargs: Any,
) -> None:
    """Add ``flag`` with its default read from the environment variable named like it
    (``--state-dir``: STATE_DIR, or ``env``), else ``default``; an empty variable counts
    as unset. argparse converts a string default with the flag's ``type``, as it would
    the flag's own value, so a bad variable fails like a bad flag."""
    name = env or flag.removeprefix("--").replace("-", "_").upper()
    parser.add_argument(flag, default=os.environ.get(name) or default, **kwargs)


def positive_seconds(value: str) -> float:
    """A flag's number of seconds, finite and greater than 0 (argparse names the flag on
    error)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{value!r}: seconds greater than 0")
    return seconds
