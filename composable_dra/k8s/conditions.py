"""Status conditions (``metav1.Condition``) as the suite's controllers write them."""

from __future__ import annotations

import time

from composable_dra.k8s.kube import JSON
from composable_dra.k8s.timestamps import format_time

MESSAGE_LIMIT = 1000  # characters kept of a message: status stays small


def condition(kind: str, ok: bool, reason: str, message: str, at: float | None = None) -> JSON:
    """A condition of type ``kind``, True when ``ok``; ``at``: its transition time (Unix
    seconds; now when None), so pure decisions can pass the time they decided at."""
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "lastTransitionTime": format_time(time.time() if at is None else at),
    }


def find(conditions: list[JSON] | None, kind: str) -> JSON | None:
    """The condition of type ``kind`` in a list, if any."""
    return next((c for c in conditions or [] if c.get("type") == kind), None)
