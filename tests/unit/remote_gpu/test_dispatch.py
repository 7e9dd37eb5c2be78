"""The block dispatcher: bounded in flight per block, results in submission order, lost
frames given out again, each result once."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remote_gpu.dispatch import Dispatch, Dispatcher, NotHeld

BLOCKS = ["a", "b", "c"]
# An operation: submit, take by a block, answer the block's oldest or newest frame, or
# lose a block.
Op = st.one_of(
    st.tuples(st.just("submit"), st.just(""), st.booleans()),
    st.tuples(st.just("take"), st.sampled_from(BLOCKS), st.booleans()),
    st.tuples(st.just("done"), st.sampled_from(BLOCKS), st.booleans()),
    st.tuples(st.just("lost"), st.sampled_from(BLOCKS), st.booleans()),
)


@settings(max_examples=300)
@given(st.integers(1, 3), st.lists(Op, max_size=80))
def test_any_interleaving_keeps_the_bound_the_order_and_each_frame_once(
    bound: int, ops: list[tuple[str, str, bool]]
) -> None:
    d: Dispatch[int, int] = Dispatch(bound)
    out: list[int] = []
    for kind, block, flag in ops:
        if kind == "submit":
            d.submit(d.submitted * 10)
        elif kind == "take":
            got = d.take(block)
            assert got is None or got[1] == got[0] * 10  # the frame of that number
        elif kind == "done" and d.in_flight(block):
            held = sorted(d.held[block])
            seq = held[-1] if flag else held[0]
            d.done(block, seq, seq * 10 + 1)
        elif kind == "lost":
            d.lost(block)
        assert all(d.in_flight(b) <= bound for b in BLOCKS)
        out.extend(r for _, r in d.ready())
    # Results in submission order, each once: a prefix of every frame's result.
    assert out == [seq * 10 + 1 for seq in range(len(out))]
    # Drain: every frame still queued or held is answered, and comes out in order.
    for b in BLOCKS:
        d.lost(b)
    while (got := d.take("drain")) is not None:
        d.done("drain", got[0], got[0] * 10 + 1)
    out.extend(r for _, r in d.ready())
    assert out == [seq * 10 + 1 for seq in range(d.submitted)]


def test_a_block_at_its_bound_gets_nothing_until_it_answers() -> None:
    d: Dispatch[str, str] = Dispatch(2)
    for f in "xyz":
        d.submit(f)
    assert d.take("a") == (0, "x") and d.take("a") == (1, "y")
    assert d.take("a") is None and d.depth == 1
    assert d.take("b") == (2, "z")
    d.done("a", 1, "Y")
    assert d.ready() == []  # frame 0 comes first
    d.done("a", 0, "X")
    assert d.ready() == [(0, "X"), (1, "Y")]


def test_an_answer_for_a_frame_not_held_is_refused_and_changes_nothing() -> None:
    d: Dispatch[str, str] = Dispatch(1)
    d.submit("x")
    assert d.take("a") == (0, "x")
    with pytest.raises(NotHeld):
        d.done("b", 0, "X")
    d.done("a", 0, "X")
    with pytest.raises(NotHeld):
        d.done("a", 0, "again")
    assert d.ready() == [(0, "X")]


def test_a_lost_blocks_frames_go_first_to_the_next_block() -> None:
    d: Dispatch[str, str] = Dispatch(2)
    for f in "wxyz":
        d.submit(f)
    d.take("a"), d.take("a")
    assert d.lost("a") == [0, 1]
    assert [d.take("b"), d.take("b")] == [(0, "w"), (1, "x")]


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Dispatch(0)


def test_threads_wait_for_room_and_for_results_in_order() -> None:
    d: Dispatcher[int, int] = Dispatcher(1)
    assert d.take("a", 0.01) is None  # nothing queued: the wait ends at its deadline
    for i in range(6):
        d.submit(i)
    taken: dict[str, list[int]] = {"a": [], "b": []}

    def block(name: str) -> None:
        while (got := d.take(name, 0.2)) is not None:
            taken[name].append(got[0])
            d.done(name, got[0], got[1] * 2)

    threads = [threading.Thread(target=block, args=(b,)) for b in taken]
    for t in threads:
        t.start()
    results: list[int] = []
    while len(results) < 6:
        got = d.ready(10)
        assert got, "no result within 10 s"
        results.extend(r for _, r in got)
    for t in threads:
        t.join(10)
    assert results == [0, 2, 4, 6, 8, 10]
    assert sorted(taken["a"] + taken["b"]) == list(range(6))
