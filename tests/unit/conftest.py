"""Fixtures the unit tests share, and how their fuzz tests are bounded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from composable_dra.serving import limits as serving_limits
from fabric_emulator.fsas.config import FsasConfig, process_args
from fabric_emulator.testing import EmulatorProcess

from .servers import Loop

# Every fuzz test here runs bounded and reproducible: the same examples on each run, no
# example database on disk, no per-example deadline on a loaded machine. Tests set only
# max_examples.
settings.register_profile(
    "bounded",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("bounded")


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorProcess]:
    """One fabric emulator per test module; its changes run as tasks done after one poll."""
    with EmulatorProcess(async_polls=1) as e:
        yield e


@pytest.fixture
def loop() -> Iterator[Loop]:
    """An event loop on a thread of its own, for servers under test."""
    running = Loop()
    yield running
    running.close()


@pytest.fixture
def fresh_budget(monkeypatch: pytest.MonkeyPatch) -> serving_limits.Budget:
    """A connection budget of this test's own for the servers it starts: the process's
    keeps the places of connections whose loops other tests stopped without closing
    them."""
    budget = serving_limits.Budget()
    monkeypatch.setattr(serving_limits, "_process", budget)
    return budget


def fsas_emulator(
    tmp_path_factory: pytest.TempPathFactory, config: FsasConfig
) -> Iterator[EmulatorProcess]:
    """For a module's fixture: a fabric emulator that also serves the Fsas FM API with
    ``config`` (``yield from fsas_emulator(tmp_path_factory, CONFIG)``)."""
    work = tmp_path_factory.mktemp("fsas-emu")
    with EmulatorProcess(extra_args=process_args(work, config), workdir=work) as e:
        yield e
