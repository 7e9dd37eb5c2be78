"""composable_dra.k8s.informer.InformerDriven: the controllers' loop and thread pools."""

from __future__ import annotations

import threading
import time

import pytest

from composable_dra.k8s.informer import PASS_REST_CAP, InformerDriven, rest_after


class _Passes(InformerDriven):
    """No informers: synced at once. Its first pass fails; each pass is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.passes = 0
        self.failures: list[str] = []
        self.done = threading.Event()

    def one_pass(self) -> None:
        self.passes += 1
        if self.passes == 1:
            raise RuntimeError("first pass fails")
        self.done.set()

    def _loop(self) -> None:
        self._debounced_passes(
            self.one_pass,
            every=lambda: 60.0,
            debounce=0.01,
            on_error=lambda exc, _retry_in: self.failures.append(str(exc)),
        )


def test_debounced_passes_run_on_a_wake_and_retry_a_failed_pass() -> None:
    ctl = _Passes()
    writes = ctl._executor(1, "test-writes")
    ctl.start()
    try:
        ctl._wake.set()
        assert ctl.done.wait(10)
        assert ctl.passes == 2 and ctl.failures == ["first pass fails"]
        assert not ctl._wake.is_set()  # the wake that led to the pass is used up
    finally:
        ctl.stop()
    assert ctl._thread is not None and not ctl._thread.is_alive()
    with pytest.raises(RuntimeError):  # its thread pools stop with it
        writes.submit(print)


class _SlowPasses(InformerDriven):
    """No informers; every pass costs ``cost`` seconds of CPU (or, ``waits``, of waiting)
    and notes when it began."""

    def __init__(self, cost: float, rest: bool, waits: bool = False) -> None:
        super().__init__()
        self.cost, self.rest, self.waits = cost, rest, waits
        self.began: list[float] = []
        self.took: list[float] = []
        self.two = threading.Event()

    def one_pass(self) -> None:
        self.began.append(time.monotonic())
        c0 = time.thread_time()
        if self.waits:
            time.sleep(self.cost)  # a pass that waits on its writes
        while not self.waits and time.thread_time() - c0 < self.cost:
            pass
        self.took.append(time.thread_time() - c0)
        self._wake.set()  # events keep coming, as in a burst
        if len(self.began) >= 2:
            self.two.set()

    def _loop(self) -> None:
        self._debounced_passes(
            self.one_pass, every=lambda: 60.0, debounce=0.0, on_error=print, rest=self.rest
        )


def _two_passes(ctl: _SlowPasses) -> _SlowPasses:
    """``ctl`` started, woken, and stopped after its second pass."""
    ctl.start()
    try:
        ctl._wake.set()
        assert ctl.two.wait(10)
    finally:
        ctl.stop()
    return ctl


def test_rest_after_grows_with_the_pass_s_cost() -> None:
    assert rest_after(0.001) == pytest.approx(0.001)  # a small cluster: as long again
    assert rest_after(0.005) == pytest.approx(0.025)  # five times
    assert rest_after(0.02) == pytest.approx(0.4)  # twenty times: a thousand nodes
    assert rest_after(30) == PASS_REST_CAP
    for rest in (True, False):
        ctl = _two_passes(_SlowPasses(0.05, rest))
        gap = ctl.began[1] - ctl.began[0]
        if rest:  # the pass, then its rest (the cap, 1 s, for 50 ms of CPU)
            assert gap >= ctl.took[0] + rest_after(ctl.took[0]) - 0.01
        else:  # with events coming, the next pass follows at once
            assert gap < 2 * ctl.took[0] + 0.5


def test_a_pass_rests_for_its_cpu_not_for_what_it_waited() -> None:
    ctl = _two_passes(_SlowPasses(0.2, rest=True, waits=True))
    # By wall time (0.2 s) it would rest the cap, 1 s; its CPU was next to nothing.
    assert ctl.began[1] - ctl.began[0] < 0.2 + 0.5
