"""Fixtures the backend tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fabric_emulator.testing import EmulatorProcess


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorProcess]:
    """One fabric emulator per test module; its changes run as tasks done after one poll."""
    with EmulatorProcess(async_polls=1) as e:
        yield e
