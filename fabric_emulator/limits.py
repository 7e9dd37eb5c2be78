"""The emulator's bounds: request bodies (JSON only, bounded in size and nesting, parsed
without surprises) and its runtime settings.

Whatever the bytes, :func:`parse_json` returns a value or raises ValueError
(composable_dra/fabric/bounded_json.py, which the fabric backends read answers with too).
"""

from __future__ import annotations

from typing import Any

from composable_dra.fabric import bounded_json

MAX_BODY = 1024 * 1024  # bytes; Redfish requests here are a few hundred
MAX_DEPTH = 32  # the deepest request this service reads is 4 levels
# The largest value each runtime setting takes (from the CLI or PATCH /admin/config): a
# task that never ends or a Retry-After of days would only wedge the clients under test.
SETTING_MAX: dict[str, int] = {"async_polls": 1000, "retry_after": 3600, "task_seconds": 3600}
PAGE_SIZE_MAX = 100_000  # --page-size: members in one response of a collection


def parse_json(raw: bytes, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``raw`` (UTF-8); ValueError naming the problem otherwise."""
    return bounded_json.loads(raw, max_depth)
