"""Functions the tests put on a donor's allow-list besides ``remote_gpu.builtins``."""

from __future__ import annotations

import numpy as np


def reshape_in_place(a: np.ndarray) -> np.ndarray:
    """Return the argument itself, reshaped in place: the worker must not take it for the
    argument as it came (same object, other shape)."""
    a.shape = (2, -1)
    return a


def both(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The argument twice, and a new array."""
    return a, a + 1
