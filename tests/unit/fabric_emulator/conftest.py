from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from fabric_emulator.testing import EmulatorProcess

REPO = Path(__file__).resolve().parents[3]
ROOT = "/redfish/v1"
BLOCKS = f"{ROOT}/CompositionService/ResourceBlocks"


# DMTF's CSDL schemas and message registries, carried in the repository (BSD-3-Clause,
# tests/data/redfish/LICENSE.md): the tests read nothing from outside the clone.
REDFISH_DATA = REPO / "tests" / "data" / "redfish"


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
