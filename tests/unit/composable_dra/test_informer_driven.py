"""composable_dra.k8s.informer.InformerDriven: the controllers' loop and thread pools."""

from __future__ import annotations

import threading

import pytest

from composable_dra.k8s.informer import InformerDriven


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
