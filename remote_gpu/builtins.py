"""Functions an admin may put on a donor's allow-list; also used by tests and benchmarks."""

from __future__ import annotations

import itertools
import time

import numpy as np

from remote_gpu.idempotency import idempotent


@idempotent
def echo(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Return the arguments unchanged (in place: no copy on the donor)."""
    return arrays


@idempotent
def sink(*arrays: np.ndarray) -> np.ndarray:
    """Take the arguments, return how many bytes they hold: a one-way transfer (eight
    bytes come back), as an upload to the device is."""
    return np.asarray([sum(a.nbytes for a in arrays)], dtype=np.int64)


@idempotent
def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.add(a, b)
    return out


@idempotent
def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.matmul(a, b)
    return out


def fail(*_arrays: np.ndarray) -> np.ndarray:
    raise ValueError("this function always fails")


@idempotent
def feature_extract(frame: np.ndarray) -> np.ndarray:
    """Emulate a 66 ms feature-extraction stage: 66 ms of device time, a small result."""
    time.sleep(0.066)
    return np.asarray(frame.reshape(-1)[:256], dtype=np.float32)


@idempotent
def big(n: np.ndarray) -> np.ndarray:
    """Return a fresh array of ``n[0]`` bytes (to test the memory quota on results)."""
    return np.zeros(int(n.reshape(-1)[0]), dtype=np.uint8)


@idempotent
def paced_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``matmul`` that takes at least 50 ms: a heavy kernel's stand-in with a known service
    time (the lending policy's SLO tests)."""
    time.sleep(0.05)
    return matmul(a, b)


_counted = itertools.count(1)


def counter(*_arrays: np.ndarray) -> np.ndarray:
    """How many times this worker has run it: not idempotent (a call run twice counts
    twice), so a client never retries it after a lost connection."""
    return np.asarray([next(_counted)], dtype=np.int64)
