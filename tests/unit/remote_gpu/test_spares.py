"""Result buffers used again once the caller has dropped the results made from them."""

from __future__ import annotations

import numpy as np
import pytest

from remote_gpu.client import RemoteGPU
from remote_gpu.spares import SMALLEST, Spares

from .conftest import Running

BIG = SMALLEST * 2


def _at(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def test_a_dropped_result_s_buffer_is_used_again() -> None:
    spares = Spares(keep=2)
    first = spares.empty((BIG,), np.dtype(np.uint8))
    where = _at(first)
    del first
    again = spares.empty((BIG // 4,), np.dtype(np.float32))
    assert _at(again) == where
    assert again.shape == (BIG // 4,) and again.dtype == np.float32
    assert again.flags.c_contiguous and again.flags.writeable


def test_a_buffer_is_not_handed_out_while_any_view_of_its_result_lives() -> None:
    spares = Spares(keep=4)
    held = spares.empty((4, BIG // 4), np.dtype(np.uint8))
    part = held[1:, ::2]  # a view of a view: it keeps the buffer too
    del held
    other = spares.empty((BIG,), np.dtype(np.uint8))
    assert not np.shares_memory(part, other)
    part[...] = 7
    other[...] = 9
    assert (part == 7).all()
    assert part.base is not None
    where = _at(part.base)
    del part
    # The first buffer is free again; the second is still held by ``other``.
    assert _at(spares.empty((BIG,), np.dtype(np.uint8))) == where


def test_small_results_and_results_past_keep_get_arrays_of_their_own() -> None:
    spares = Spares(keep=2)
    small = [spares.empty((SMALLEST // 8 - 1,), np.dtype(np.float64)) for _ in range(3)]
    assert all(s.base is None for s in small)  # plain arrays, nothing kept for them
    held = [spares.empty((BIG,), np.dtype(np.uint8)) for _ in range(3)]
    for i, h in enumerate(held):
        h[...] = i
    assert [int(h[0]) for h in held] == [0, 1, 2]
    assert len({_at(h) for h in held}) == 3
    kept = {_at(h) for h in held[:2]}
    del held
    again = [spares.empty((BIG,), np.dtype(np.uint8)) for _ in range(2)]
    assert {_at(a) for a in again} == kept


def test_a_larger_result_replaces_a_free_buffer_too_small_for_it() -> None:
    spares = Spares(keep=1)
    spares.empty((BIG,), np.dtype(np.uint8))  # dropped at once
    bigger = spares.empty((2 * BIG,), np.dtype(np.uint8))
    where = _at(bigger)
    del bigger
    assert _at(spares.empty((2 * BIG,), np.dtype(np.uint8))) == where


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_copied_results_stay_intact_while_later_calls_reuse_dropped_buffers(
    donor: Running, transport: str
) -> None:
    """Copies of large results (``views=False`` over shared memory; every TCP result)
    are never overwritten while the caller holds them, and their memory serves the next
    results once dropped."""
    with RemoteGPU(donor.endpoint, donor.token(), transport=transport, views=False) as gpu:
        held = [gpu.invoke("echo", np.full(BIG, i, dtype=np.uint8))[0] for i in range(12)]
        futures = [gpu.submit("echo", np.full(BIG, 100 + i, dtype=np.uint8)) for i in range(8)]
        assert [int(f.result(10)[0][0]) for f in futures] == [100 + i for i in range(8)]
        assert [(int(h.min()), int(h.max())) for h in held] == [(i, i) for i in range(12)]
        del held, futures
        (again,) = gpu.invoke("echo", np.full(BIG, 200, dtype=np.uint8))
        assert (again == 200).all()
        assert any(again.base is kept for kept in gpu._spares._bufs)
