"""Reading Redfish collections (composable_dra/fabric/members.py): $expand when the service
advertises it, per-member reads when not, next-page links checked before they are followed;
and the backend's inventory read against the emulator in a bounded number of requests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from composable_dra.fabric import errors as fe
from composable_dra.fabric import members
from composable_dra.fabric.redfish import RedfishCompositionBackend
from dra_driver.sources.redfish import RedfishCredentials, RedfishSource
from fabric_emulator.testing import EmulatorProcess
from fabric_emulator.topology import host_uuid

ROOT = "/redfish/v1"
ENDPOINT = "https://fabric.example:8443"
THINGS = f"{ROOT}/Things"


def _service(pages: dict[str, dict[str, Any]]) -> tuple[members.Get, list[str]]:
    """A fake GET over fixed documents, recording the paths read."""
    read: list[str] = []

    def get(path: str) -> dict[str, Any]:
        read.append(path)
        return pages[path]

    return get, read


def _thing(i: int) -> dict[str, Any]:
    return {"@odata.id": f"{THINGS}/{i}", "Id": str(i)}


@pytest.mark.parametrize(
    ("root", "expected", "query"),
    [
        ({}, members.NO_EXPAND, ""),
        ({"ProtocolFeaturesSupported": {"ExpandQuery": {"NoLinks": False}}}, members.NO_EXPAND, ""),
        (
            {"ProtocolFeaturesSupported": {"ExpandQuery": {"NoLinks": True}}},
            members.Expand("."),
            "?$expand=.",
        ),
        (
            {"ProtocolFeaturesSupported": {"ExpandQuery": {"ExpandAll": True, "Levels": False}}},
            members.Expand("*"),
            "?$expand=*",
        ),
        (
            {
                "ProtocolFeaturesSupported": {
                    "ExpandQuery": {"NoLinks": True, "Levels": True, "MaxLevels": 6}
                }
            },
            members.Expand(".", 6),
            "?$expand=.($levels=2)",
        ),
    ],
)
def test_the_expand_a_service_advertises(
    root: dict[str, Any], expected: members.Expand, query: str
) -> None:
    assert members.expand_of(root) == expected
    assert members.query(expected, levels=2) == query


def test_without_expand_each_member_is_read_on_its_own() -> None:
    docs: dict[str, dict[str, Any]] = {
        THINGS: {"Members": [{"@odata.id": f"{THINGS}/{i}"} for i in range(5)]}
    }
    docs.update({f"{THINGS}/{i}": {"Id": str(i)} for i in range(5)})
    get, read = _service(docs)
    got = members.members(get, THINGS, ENDPOINT)
    assert got == [{"@odata.id": f"{THINGS}/{i}", "Id": str(i)} for i in range(5)]
    assert len(read) == 6


def test_expanded_pages_take_one_request_each() -> None:
    first, second = f"{THINGS}?$expand=.", f"{THINGS}?$skip=3&$expand=."
    docs: dict[str, dict[str, Any]] = {
        first: {"Members": [_thing(i) for i in range(3)], "Members@odata.nextLink": second},
        second: {"Members": [_thing(i) for i in range(3, 5)]},
    }
    get, read = _service(docs)
    got = members.members(get, THINGS, ENDPOINT, members.Expand("."))
    assert got == [_thing(i) for i in range(5)]
    assert read == [first, second]


def test_a_member_the_service_did_not_inline_is_read() -> None:
    page = {"Members": [_thing(0), {"@odata.id": f"{THINGS}/1"}]}
    get, read = _service({f"{THINGS}?$expand=.": page, f"{THINGS}/1": _thing(1)})
    assert members.members(get, THINGS, ENDPOINT, members.Expand(".")) == [_thing(0), _thing(1)]
    assert read == [f"{THINGS}?$expand=.", f"{THINGS}/1"]


@pytest.mark.parametrize(
    ("link", "why"),
    [
        ("https://evil.example/redfish/v1/Things?$skip=2", "another service"),
        ("http://fabric.example:8443/redfish/v1/Things?$skip=2", "another service"),
        ("//evil.example/redfish/v1/Things", "another service"),
        ("/redfish/v1/../../etc/passwd", "outside"),
        ("/redfish/v1/%2e%2e/admin/faults", "outside"),
        ("/admin/faults", "outside"),
        ("Things?$skip=2", "outside"),
        (7, "not a URI"),
        ("", "not a URI"),
        (f"{THINGS}", "a loop"),  # the first page again
    ],
)
def test_a_hostile_next_link_is_refused(link: Any, why: str) -> None:
    docs = {THINGS: {"Members": [_thing(0)], "Members@odata.nextLink": link}}
    get, read = _service(docs)
    with pytest.raises(members.PagingError, match=why):
        members.members(get, THINGS, ENDPOINT)
    assert read == [THINGS]  # nothing was read from the link


def test_a_next_link_on_the_same_service_is_followed_and_a_loop_is_caught() -> None:
    second = f"{ENDPOINT}{THINGS}?$skip=1"
    docs = {
        THINGS: {"Members": [_thing(0)], "Members@odata.nextLink": second},
        f"{THINGS}?$skip=1": {"Members": [_thing(1)], "Members@odata.nextLink": second},
    }
    get, read = _service(docs)
    with pytest.raises(members.PagingError, match="a loop"):
        members.members(get, THINGS, ENDPOINT)
    assert read == [THINGS, f"{THINGS}?$skip=1"]


def test_pages_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(members, "MAX_PAGES", 3)

    def endless(path: str) -> dict[str, Any]:
        n = int(path.rpartition("=")[2]) if "=" in path else 0
        return {"Members": [_thing(n)], "Members@odata.nextLink": f"{THINGS}?$skip={n + 1}"}

    with pytest.raises(members.PagingError, match="more than 3 pages"):
        members.members(endless, THINGS, ENDPOINT)


# -- the backend against the emulator ------------------------------------------------------


def _topology(blocks: int) -> dict[str, Any]:
    hosts = [f"node-{i}" for i in range(4)]
    return {
        "hosts": [{"id": h} for h in hosts],
        "zones": [
            {
                "id": f"zone-{z}",
                "hosts": hosts[2 * z : 2 * z + 2],
                "blocks": [
                    {"id": f"gpu-{z}-{i}", "model": "NVIDIA H100 80GB HBM3"}
                    for i in range(blocks // 2)
                ],
            }
            for z in range(2)
        ],
    }


@pytest.fixture(scope="module")
def fabrics() -> Iterator[dict[int, EmulatorProcess]]:
    """Two fabrics of 20 and 200 GPU blocks, collections paged at 64 members."""
    with (
        EmulatorProcess(topology=_topology(20), extra_args=["--page-size", "64"]) as small,
        EmulatorProcess(topology=_topology(200), extra_args=["--page-size", "64"]) as large,
    ):
        yield {20: small, 200: large}


def _counted(backend: RedfishCompositionBackend, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real: Callable[..., Any] = backend._request

    def counting(method: str, uri: str, *args: Any) -> Any:
        seen.append(f"{method} {uri}")
        return real(method, uri, *args)

    monkeypatch.setattr(backend, "_request", counting)
    return seen


@pytest.mark.parametrize("n", [20, 200])
def test_the_inventory_is_read_in_pages_not_per_block(
    fabrics: dict[int, EmulatorProcess], n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = fabrics[n]
    backend = RedfishCompositionBackend(emu.url, "admin", "admin")
    try:
        seen = _counted(backend, monkeypatch)
        inv = backend.inventory()
        assert len(inv.devices) == n and len(inv.hosts) == 4
        assert inv.zones["zone-1"].hosts == {"node-2", "node-3"}
        assert len(inv.zones["zone-0"].devices) == n // 2
        # Root, systems, one request per 64 blocks (the 4 hosts' blocks included), zones.
        assert len(seen) == 1 + 1 + -(-(n + 4) // 64) + 1, seen
        assert all("$expand=." in r for r in seen[1:]), seen
        seen.clear()
        assert backend.inventory() == inv
        assert len(seen) == 1 + -(-(n + 4) // 64) + 1  # the root is read once
    finally:
        backend.close()


def test_a_service_without_expand_is_read_per_member(
    fabrics: dict[int, EmulatorProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    n, emu = 20, fabrics[20]
    expanded = RedfishCompositionBackend(emu.url, "admin", "admin")
    plain = RedfishCompositionBackend(emu.url, "admin", "admin")
    try:
        plain._expand = members.NO_EXPAND  # as if the ServiceRoot advertised no $expand
        seen = _counted(plain, monkeypatch)
        assert plain.inventory() == expanded.inventory()
        assert not any("$expand" in r for r in seen)
        # Systems and their 4 members; blocks and theirs, with each GPU's Processor; zones.
        assert len(seen) == (1 + 4) + (1 + n + 4 + n) + (1 + 2), seen
    finally:
        expanded.close()
        plain.close()


def test_a_paging_defect_is_a_fabric_error(
    fabrics: dict[int, EmulatorProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = fabrics[20]
    backend = RedfishCompositionBackend(emu.url, "admin", "admin")
    real = backend._get

    def hostile(uri: str) -> dict[str, Any]:
        body = real(uri)
        if "Members" in body:
            body["Members@odata.nextLink"] = "https://elsewhere.example/redfish/v1/Systems"
        return body

    monkeypatch.setattr(backend, "_get", hostile)
    try:
        with pytest.raises(fe.FabricError, match="another service"):
            backend.hosts()
    finally:
        backend.close()


def test_the_plugin_source_reads_its_gpus_in_a_fixed_number_of_requests(
    fabrics: dict[int, EmulatorProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    emu = fabrics[200]
    emu.reset()
    backend = RedfishCompositionBackend(emu.url, "admin", "admin")
    try:
        for block in ("gpu-0-1", "gpu-0-2", "gpu-0-3"):
            assert backend.attach(block, "node-0") is None  # synchronous: done
    finally:
        backend.close()
    src = RedfishSource(emu.url, host_uuid("node-0"), RedfishCredentials("admin", "admin"))
    read: list[str] = []
    real = src._get

    def counted(path: str) -> dict[str, Any]:
        read.append(path)
        return real(path)

    monkeypatch.setattr(src, "_get", counted)
    assert len(src.list_devices()) == 3
    assert len(read) == 4  # root, systems (inlined), the system, its processors (inlined)
    read.clear()
    assert len(src.list_devices()) == 3
    assert len(read) == 2
    src.close()
    emu.reset()
