"""The DMTF ``redfish`` Python client against the emulator: login, attach, task, detach."""

from __future__ import annotations

import redfish
import requests

from fabric_emulator.testing import EmulatorProcess

from .conftest import BLOCKS, ROOT


def test_dmtf_client_attach_follow_task_and_detach(emu: EmulatorProcess) -> None:
    emu.configure(async_polls=2, retry_after=0)
    client = redfish.redfish_client(base_url=emu.url, username="admin", password="admin")
    client.login(auth="session")
    try:
        systems = client.get(f"{ROOT}/Systems")
        assert systems.status == 200
        system = client.get(f"{ROOT}/Systems/node-1").dict
        target = system["Actions"]["#ComputerSystem.AddResourceBlock"]["target"]
        body = {"ResourceBlock": {"@odata.id": f"{BLOCKS}/gpu-3"}}
        response = client.post(target, body=body)
        assert response.status == 202
        assert response.is_processing
        task = response.monitor(client)
        polls = 1
        while task.is_processing:
            assert task.retry_after == 0  # nothing to wait for; poll again at once
            task = task.monitor(client)
            polls += 1
            assert polls < 10
        assert task.status == 200, task.text
        assert polls == 2
        assert emu.state()["blocks"]["gpu-3"]["system"] == "node-1"
        gpu = client.get(f"{ROOT}/Systems/node-1/Processors/gpu-3").dict
        assert "GPU-" + gpu["UUID"] == emu.state()["blocks"]["gpu-3"]["uuid"]

        emu.configure(async_polls=0)
        remove = system["Actions"]["#ComputerSystem.RemoveResourceBlock"]["target"]
        response = client.post(remove, body=body)
        assert response.status == 200
        assert emu.state()["blocks"]["gpu-3"]["state"] == "Unused"
        assert client.get(f"{ROOT}/Systems/node-1/Processors/gpu-3").status == 404
    finally:
        client.logout()
    assert emu.admin("GET", "state") is not None
    # the session is gone after logout
    listed = requests.get(
        f"{emu.url}{ROOT}/SessionService/Sessions", auth=("admin", "admin"), timeout=10
    ).json()
    assert listed["Members"] == []
