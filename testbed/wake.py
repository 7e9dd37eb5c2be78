"""What the wake-up tests read of a slice writer (composable_dra/k8s/wake.py): its touches."""

from __future__ import annotations

from composable_dra.k8s.wake import TOUCH_EVENT
from testbed.process import ComponentProcess


def touches(process: ComponentProcess) -> list[dict[str, object]]:
    """The slice writes ``process`` made only to wake pods, from its log."""
    return [e for e in process.log_events() if e.get("event") == TOUCH_EVENT]
