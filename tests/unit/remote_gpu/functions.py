"""Functions the tests put on a donor's allow-list besides ``remote_gpu.builtins``."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from remote_gpu.idempotency import idempotent


def reshape_in_place(a: np.ndarray) -> np.ndarray:
    """Return the argument itself, reshaped in place: the worker must not take it for the
    argument as it came (same object, other shape)."""
    a.shape = (2, -1)
    return a


def both(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The argument twice, and a new array."""
    return a, a + 1


def _first_run_hangs(marker: np.ndarray) -> np.ndarray:
    """The first run (no file at the path ``marker`` spells) creates the file and hangs,
    so that the test can end its connection while it is in flight; a run after that
    returns at once. The result is the argument, whichever run."""
    path = Path(bytes(marker).decode())
    if not path.exists():
        path.touch()
        time.sleep(30)  # the test ends the lease (and this worker) long before
    return marker


@idempotent
def hangs_once(marker: np.ndarray) -> np.ndarray:
    """``_first_run_hangs``, declared idempotent."""
    return _first_run_hangs(marker)


def hangs_once_unsafe(marker: np.ndarray) -> np.ndarray:
    """``_first_run_hangs``, not declared idempotent."""
    return _first_run_hangs(marker)
