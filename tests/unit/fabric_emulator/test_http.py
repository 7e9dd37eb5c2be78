"""The Redfish service over real HTTP: auth, composition, links, PATCH, tasks, restart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import requests

from fabric_emulator.testing import EmulatorProcess
from testbed.wait import wait_for

from .conftest import BLOCKS, ROOT, Client, message_ids


def test_public_documents_and_refused_requests(emu: EmulatorProcess) -> None:
    anon = requests.Session()
    root = anon.get(f"{emu.url}{ROOT}/", timeout=10)
    assert root.status_code == 200 and root.headers["OData-Version"] == "4.0"
    assert root.json()["Links"]["Sessions"]["@odata.id"] == f"{ROOT}/SessionService/Sessions"
    assert anon.get(f"{emu.url}/redfish", timeout=10).json() == {"v1": "/redfish/v1/"}
    meta = anon.get(f"{emu.url}{ROOT}/$metadata", timeout=10)
    assert meta.headers["Content-Type"].startswith("application/xml")
    assert 'Namespace="ResourceBlock.v1_4_3"' in meta.text
    assert anon.get(f"{emu.url}{ROOT}/odata", timeout=10).json()["value"][0]["url"] == f"{ROOT}/"
    refused = anon.get(f"{emu.url}{ROOT}/Systems", timeout=10)
    assert refused.status_code == 401
    assert message_ids(refused) == ["Base.1.19.NoValidSession"]
    wrong = anon.get(f"{emu.url}{ROOT}/Systems", auth=("admin", "nope"), timeout=10)
    assert wrong.status_code == 401
    assert anon.get(f"{emu.url}{ROOT}/Systems", auth=("admin", "admin"), timeout=10).ok


def test_the_admin_api_needs_the_admin_token(emu: EmulatorProcess) -> None:
    anon = requests.Session()
    assert anon.get(f"{emu.url}/admin/healthz", timeout=10).ok  # probes need no token
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": "Basic YWRtaW46YWRtaW4="},
    ):
        refused = anon.get(f"{emu.url}/admin/state", headers=headers, timeout=10)
        assert refused.status_code == 401, headers
        changed = anon.post(
            f"{emu.url}/admin/faults", json={"kind": "status500"}, headers=headers, timeout=10
        )
        assert changed.status_code == 401
    assert not [r for r in emu.admin("GET", "faults")["rules"] if r.get("kind") == "status500"]
    ok = anon.get(
        f"{emu.url}/admin/state",
        headers={"Authorization": f"Bearer {emu.admin_token}"},
        timeout=10,
    )
    assert ok.status_code == 200 and "blocks" in ok.json()


def test_session_login_and_logout(emu: EmulatorProcess) -> None:
    s = requests.Session()
    sessions = f"{emu.url}{ROOT}/SessionService/Sessions"
    bad = s.post(sessions, json={"UserName": "admin", "Password": "x"}, timeout=10)
    assert bad.status_code == 401
    resp = s.post(sessions, json={"UserName": "admin", "Password": "admin"}, timeout=10)
    assert resp.status_code == 201
    token, location = resp.headers["X-Auth-Token"], resp.headers["Location"]
    assert location.startswith(f"{ROOT}/SessionService/Sessions/")
    assert resp.json()["Password"] is None
    headers = {"X-Auth-Token": token}
    assert s.get(f"{emu.url}{ROOT}/Systems", headers=headers, timeout=10).status_code == 200
    listed = s.get(sessions, headers=headers, timeout=10).json()["Members"]
    assert {"@odata.id": location} in listed
    assert s.delete(f"{emu.url}{location}", headers=headers, timeout=10).status_code == 204
    after = s.get(f"{emu.url}{ROOT}/Systems", headers=headers, timeout=10)
    assert after.status_code == 401


def test_systems_have_uuids_from_the_topology(client: Client, emu: EmulatorProcess) -> None:
    dump = emu.state()
    members = client.get(f"{ROOT}/Systems").json()["Members"]
    assert [m["@odata.id"] for m in members] == [f"{ROOT}/Systems/node-{i}" for i in (1, 2, 3)]
    for host, info in dump["systems"].items():
        system = client.get(f"{ROOT}/Systems/{host}").json()
        assert system["UUID"] == info["uuid"]
        assert system["SystemType"] == "Physical"
        assert system["Composition"]["UseCases"] == ["ExpandableSystem"]


def _links(doc: dict[str, Any], key: str) -> list[str]:
    return [x["@odata.id"] for x in doc["Links"][key]]


def test_attach_and_detach_keep_every_link_consistent(client: Client, emu: EmulatorProcess) -> None:
    block_uri = f"{BLOCKS}/gpu-2"
    before = client.get(block_uri).json()
    assert before["CompositionStatus"]["CompositionState"] == "Unused"
    assert before["ResourceBlockType"] == ["Processor"]
    gpu = client.get(before["Processors"][0]["@odata.id"]).json()
    assert gpu["ProcessorType"] == "GPU" and gpu["Model"] == "NVIDIA H100 80GB HBM3"
    assert "GPU-" + gpu["UUID"] == emu.state()["blocks"]["gpu-2"]["uuid"]
    assert gpu["ProcessorMemory"][0]["CapacityMiB"] == 81559
    free = [
        m["@odata.id"] for m in client.get(f"{ROOT}/CompositionService/FreePool").json()["Members"]
    ]
    assert block_uri in free

    resp = client.attach("node-1", "gpu-2")
    assert resp.status_code == 200, resp.text
    block = client.get(block_uri).json()
    assert block["CompositionStatus"]["CompositionState"] == "Composed"
    assert block["CompositionStatus"]["NumberOfCompositions"] == 1
    assert _links(block, "ComputerSystems") == [f"{ROOT}/Systems/node-1"]
    system = client.get(f"{ROOT}/Systems/node-1").json()
    assert block_uri in _links(system, "ResourceBlocks")
    procs = [
        m["@odata.id"] for m in client.get(f"{ROOT}/Systems/node-1/Processors").json()["Members"]
    ]
    assert f"{ROOT}/Systems/node-1/Processors/gpu-2" in procs
    host_gpu = client.get(f"{ROOT}/Systems/node-1/Processors/gpu-2").json()
    assert host_gpu["UUID"] == gpu["UUID"] and host_gpu["ProcessorType"] == "GPU"
    free = [
        m["@odata.id"] for m in client.get(f"{ROOT}/CompositionService/FreePool").json()["Members"]
    ]
    active = [
        m["@odata.id"]
        for m in client.get(f"{ROOT}/CompositionService/ActivePool").json()["Members"]
    ]
    assert block_uri not in free and block_uri in active
    assert emu.state()["systems"]["node-1"]["blocks"] == ["gpu-2"]

    # a second attach of the same block, to any host, is refused
    again = client.attach("node-2", "gpu-2")
    assert again.status_code == 409
    assert message_ids(again) == ["Composition.1.1.ResourceBlockInUse"]
    # not reachable from that host's zones
    far = client.attach("node-1", "gpu-7")
    assert far.status_code == 400 and message_ids(far) == ["Composition.1.1.IncompatibleZone"]
    missing = client.attach("node-1", "gpu-99")
    assert message_ids(missing) == ["Composition.1.1.ResourceBlockNotFound"]

    resp = client.detach("node-1", "gpu-2")
    assert resp.status_code == 200, resp.text
    block = client.get(block_uri).json()
    assert block["CompositionStatus"]["CompositionState"] == "Unused"
    assert block["CompositionStatus"]["NumberOfCompositions"] == 0
    assert _links(block, "ComputerSystems") == []
    assert block_uri not in _links(client.get(f"{ROOT}/Systems/node-1").json(), "ResourceBlocks")
    assert client.get(f"{ROOT}/Systems/node-1/Processors/gpu-2").status_code == 404
    gone = client.detach("node-1", "gpu-2")
    assert gone.status_code == 400


def test_zones_say_which_systems_they_reach(client: Client) -> None:
    zone = client.get(f"{ROOT}/CompositionService/ResourceZones/zone-2").json()
    reach = []
    gpus = []
    for uri in _links(zone, "ResourceBlocks"):
        block = client.get(uri).json()
        if block["ResourceBlockType"] == ["ComputerSystem"]:
            reach += [s["@odata.id"] for s in block["ComputerSystems"]]
        else:
            gpus.append(block["Id"])
    assert reach == [f"{ROOT}/Systems/node-2", f"{ROOT}/Systems/node-3"]
    assert gpus == ["gpu-6", "gpu-7", "gpu-8"]


def test_action_parameter_errors(client: Client) -> None:
    target = f"{ROOT}/Systems/node-1/Actions/ComputerSystem.AddResourceBlock"
    assert message_ids(client.post(target, {})) == ["Base.1.19.ActionParameterMissing"]
    assert message_ids(client.post(target, {"ResourceBlock": "gpu-1"})) == [
        "Base.1.19.ActionParameterValueTypeError"
    ]
    assert message_ids(
        client.post(target, {"ResourceBlock": {"@odata.id": f"{BLOCKS}/gpu-1"}, "X": 1})
    ) == ["Base.1.19.ActionParameterUnknown"]
    stale = client.post(
        target,
        {"ResourceBlock": {"@odata.id": f"{BLOCKS}/gpu-1"}, "ComputerSystemETag": 'W/"old"'},
    )
    assert stale.status_code == 428
    bad_json = client.s.post(
        client.url + target, data=b"{", headers={"Content-Type": "application/json"}, timeout=10
    )
    assert message_ids(bad_json) == ["Base.1.19.MalformedJSON"]
    assert client.get(f"{ROOT}/Nope").status_code == 404
    not_allowed = client.s.delete(client.url + f"{ROOT}/Systems/node-1", timeout=10)
    assert not_allowed.status_code == 405 and "GET" in not_allowed.headers["Allow"]


def test_patch_links_with_etag(client: Client, emu: EmulatorProcess) -> None:
    uri = f"{ROOT}/Systems/node-2"
    first = client.get(uri)
    etag = first.headers["ETag"]
    blocks = first.json()["Links"]["ResourceBlocks"]
    wanted = [*blocks, {"@odata.id": f"{BLOCKS}/gpu-1"}, {"@odata.id": f"{BLOCKS}/gpu-6"}]
    resp = client.patch(uri, {"Links": {"ResourceBlocks": wanted}}, headers={"If-Match": etag})
    assert resp.status_code == 200, resp.text
    assert sorted(emu.state()["systems"]["node-2"]["blocks"]) == ["gpu-1", "gpu-6"]
    assert resp.headers["ETag"] != etag
    # the old ETag no longer matches
    stale = client.patch(uri, {"Links": {"ResourceBlocks": blocks}}, headers={"If-Match": etag})
    assert stale.status_code == 412
    assert message_ids(stale) == ["Base.1.19.PreconditionFailed"]
    # remove gpu-1 with the current ETag
    current = client.get(uri).headers["ETag"]
    keep = [*blocks, {"@odata.id": f"{BLOCKS}/gpu-6"}]
    resp = client.patch(uri, {"Links": {"ResourceBlocks": keep}}, headers={"If-Match": current})
    assert resp.status_code == 200
    assert emu.state()["systems"]["node-2"]["blocks"] == ["gpu-6"]
    assert emu.state()["blocks"]["gpu-1"]["state"] == "Unused"
    ro = client.patch(uri, {"UUID": "x"})
    assert ro.status_code == 400 and message_ids(ro) == ["Base.1.19.PropertyNotWritable"]
    # a block another host holds cannot be PATCHed in
    taken = client.patch(
        f"{ROOT}/Systems/node-3", {"Links": {"ResourceBlocks": [{"@odata.id": f"{BLOCKS}/gpu-6"}]}}
    )
    assert taken.status_code == 409


def test_async_attach_runs_a_task(client: Client, emu: EmulatorProcess) -> None:
    emu.configure(async_polls=3, retry_after=2)
    resp = client.attach("node-3", "gpu-8")
    assert resp.status_code == 202
    monitor = resp.headers["Location"]
    assert resp.headers["Retry-After"] == "2"
    task_uri = resp.json()["@odata.id"]
    assert resp.json()["TaskState"] == "Running"
    assert emu.state()["blocks"]["gpu-8"]["state"] == "Composing"
    assert client.get(f"{BLOCKS}/gpu-8").json()["CompositionStatus"]["CompositionState"] == (
        "Composing"
    )
    # a concurrent attach of the pending block is refused
    assert client.attach("node-2", "gpu-8").status_code == 409
    polls = [client.get(monitor) for _ in range(2)]
    assert [p.status_code for p in polls] == [202, 202]
    assert polls[0].headers["Location"] == monitor
    done = client.get(monitor)  # third poll completes it
    assert done.status_code == 200
    assert done.json()["@Message.ExtendedInfo"][0]["MessageId"] == "Base.1.19.Success"
    assert emu.state()["blocks"]["gpu-8"]["system"] == "node-3"
    assert client.get(monitor).status_code == 404
    task = client.get(task_uri).json()
    assert task["TaskState"] == "Completed" and task["TaskStatus"] == "OK"
    assert [m["MessageId"] for m in task["Messages"]] == [
        "TaskEvent.1.0.TaskStarted",
        "TaskEvent.1.0.TaskCompletedOK",
    ]
    assert json.loads(task["Payload"]["JsonBody"])["ResourceBlock"]["@odata.id"].endswith("gpu-8")
    # polling the Task resource also counts
    resp = client.detach("node-3", "gpu-8")
    assert resp.status_code == 202
    for _ in range(3):
        client.get(task_uri.rsplit("/", 1)[0] + "/" + resp.json()["Id"])
    assert emu.state()["blocks"]["gpu-8"]["state"] == "Unused"


def test_an_unpolled_task_ends_on_its_own(client: Client, emu: EmulatorProcess) -> None:
    # A client that lost the 202 (or died) must not leave the block pending forever.
    emu.configure(async_polls=100, task_seconds=1)
    resp = client.attach("node-1", "gpu-2")
    assert resp.status_code == 202
    assert emu.state()["blocks"]["gpu-2"]["state"] == "Composing"
    wait_for(
        lambda: emu.state()["blocks"]["gpu-2"]["state"] == "Composed",
        10,
        "the task to end without polls",
    )
    assert emu.state()["blocks"]["gpu-2"]["system"] == "node-1"
    task = client.get(resp.json()["@odata.id"]).json()
    assert task["TaskState"] == "Completed"


def test_state_file_survives_a_restart(tmp_path: Path) -> None:
    state_file = tmp_path / "state.json"
    with EmulatorProcess(state_file=state_file) as emu:
        c = Client(emu.url)
        assert c.attach("node-2", "gpu-7").status_code == 200
        assert c.attach("node-1", "gpu-3").status_code == 200
        assert c.detach("node-1", "gpu-3").status_code == 200
        saved = json.loads(state_file.read_text())
        assert saved["attached"] == {"gpu-7": "node-2"}
        emu.restart()
        c = Client(emu.url)
        assert emu.state()["systems"]["node-2"]["blocks"] == ["gpu-7"]
        block = c.get(f"{BLOCKS}/gpu-7").json()
        assert block["CompositionStatus"]["CompositionState"] == "Composed"
        assert not list(tmp_path.glob(".state.json.*"))  # no temp files left behind


def test_custom_topology(tmp_path: Path) -> None:
    topo = {
        "hosts": [{"id": "h1", "uuid": "11111111-2222-3333-4444-555555555555"}],
        "zones": [{"id": "z1", "hosts": ["h1"], "blocks": [{"id": "b1", "model": "X"}]}],
    }
    with EmulatorProcess(topology=topo, user="ops", password="s3cret") as emu:
        c = Client(emu.url)
        c.s.auth = ("ops", "s3cret")
        system = c.get(f"{ROOT}/Systems/h1").json()
        assert system["UUID"] == "11111111-2222-3333-4444-555555555555"
        assert c.attach("h1", "b1").status_code == 200
        assert "s3cret" not in emu.log_tail(1000)


def test_cli_logs_the_bound_url(emu: EmulatorProcess) -> None:
    port = emu.url.rsplit(":", 1)[1]
    assert port != "0"
    lines = [json.loads(line) for line in emu.log_tail(1000).splitlines() if line.startswith("{")]
    listening = [x for x in lines if x.get("event") == "fabric emulator listening"]
    assert listening and listening[0]["url"] == emu.url
