"""What the wake-up tests read of a slice writer (composable_dra/wake.py): its touches."""

from __future__ import annotations

from hack.localcluster.process import ComponentProcess

TOUCHED = "pool touched to wake pods"


def touches(process: ComponentProcess) -> list[dict[str, object]]:
    """The slice writes ``process`` made only to wake pods, from its log."""
    return [e for e in process.log_events() if e.get("event") == TOUCHED]
