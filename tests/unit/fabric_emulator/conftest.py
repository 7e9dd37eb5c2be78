from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from fabric_emulator.testing import EmulatorProcess

REPO = Path(__file__).resolve().parents[3]
ROOT = "/redfish/v1"
BLOCKS = f"{ROOT}/CompositionService/ResourceBlocks"


def shared_dir() -> Path:
    """shared/ beside the repository (CI's fresh clone), or $COMPOSABLE_DRA_SHARED_DIR."""
    return Path(os.environ.get("COMPOSABLE_DRA_SHARED_DIR", REPO.parent / "shared"))


class Client:
    """Plain HTTP against the emulator with Basic auth."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.s = requests.Session()
        self.s.auth = ("admin", "admin")

    def get(self, path: str, **kw: Any) -> requests.Response:
        return self.s.get(self.url + path, timeout=30, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> requests.Response:
        return self.s.post(self.url + path, json=body, timeout=30, **kw)

    def patch(self, path: str, body: Any = None, **kw: Any) -> requests.Response:
        return self.s.patch(self.url + path, json=body, timeout=30, **kw)

    def attach(self, host: str, block: str) -> requests.Response:
        return self.post(
            f"{ROOT}/Systems/{host}/Actions/ComputerSystem.AddResourceBlock",
            {"ResourceBlock": {"@odata.id": f"{BLOCKS}/{block}"}},
        )

    def detach(self, host: str, block: str) -> requests.Response:
        return self.post(
            f"{ROOT}/Systems/{host}/Actions/ComputerSystem.RemoveResourceBlock",
            {"ResourceBlock": {"@odata.id": f"{BLOCKS}/{block}"}},
        )


def message_ids(resp: requests.Response) -> list[str]:
    body = resp.json()
    return [m["MessageId"] for m in body["error"]["@Message.ExtendedInfo"]]


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorProcess]:
    with EmulatorProcess() as emu:
        yield emu


@pytest.fixture
def emu(emulator: EmulatorProcess) -> EmulatorProcess:
    emulator.reset()
    return emulator


@pytest.fixture
def client(emu: EmulatorProcess) -> Client:
    return Client(emu.url)
