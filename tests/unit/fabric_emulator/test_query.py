"""Redfish query parameters: $expand, $top/$skip and server-driven paging (query.py), as
pure functions and over HTTP."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric_emulator import query
from fabric_emulator.state import RedfishError
from fabric_emulator.testing import EmulatorProcess

from .conftest import BLOCKS, ROOT, Client, message_ids

FUZZ = settings(max_examples=300)


def _collection(n: int) -> dict[str, Any]:
    return {
        "@odata.id": f"{ROOT}/Things",
        "Members@odata.count": n,
        "Members": [{"@odata.id": f"{ROOT}/Things/{i}"} for i in range(n)],
    }


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ([], query.Query()),
        ([("only", ""), ("excerpt", "")], query.Query()),  # no "$": ignored
        ([("$expand", ".")], query.Query(expand=".", raw_expand=".")),
        ([("$expand", "*($levels=2)")], query.Query("*", 2, raw_expand="*($levels=2)")),
        ([("$expand", "~($levels=1)")], query.Query("~", 1, raw_expand="~($levels=1)")),
        ([("$skip", "0"), ("$top", "5")], query.Query(skip=0, top=5)),
    ],
)
def test_queries_parse(pairs: list[tuple[str, str]], expected: query.Query) -> None:
    assert query.parse(pairs) == expected


@pytest.mark.parametrize(
    ("pairs", "status", "message"),
    [
        ([("$filter", "Id eq 'x'")], 501, "QueryParameterUnsupported"),
        ([("$select", "Id")], 501, "QueryParameterUnsupported"),
        ([("$expand", "Processors")], 400, "QueryParameterValueFormatError"),
        ([("$expand", ".($levels=3)")], 400, "QueryParameterOutOfRange"),
        ([("$expand", ".($levels=0)")], 400, "QueryParameterOutOfRange"),
        ([("$top", "0")], 400, "QueryParameterOutOfRange"),
        ([("$top", "1" * 10)], 400, "QueryParameterOutOfRange"),
        ([("$skip", "-1")], 400, "QueryParameterValueFormatError"),
        ([("$skip", "٣")], 400, "QueryParameterValueFormatError"),  # a digit, not ASCII
        ([("$top", "1"), ("$top", "2")], 400, "QueryParameterValueFormatError"),
    ],
)
def test_bad_queries_are_refused_with_the_registry_message(
    pairs: list[tuple[str, str]], status: int, message: str
) -> None:
    with pytest.raises(RedfishError) as refused:
        query.parse(pairs)
    assert refused.value.status == status
    assert refused.value.messages[0]["MessageId"].endswith(f".{message}")


_NAMES = st.sampled_from(["$expand", "$skip", "$top", "$levels", "$filter", "only", "x", ""])


@FUZZ
@given(st.lists(st.tuples(_NAMES | st.text(max_size=8), st.text(max_size=24)), max_size=4))
def test_any_query_parses_or_is_refused_with_400_or_501(pairs: list[tuple[str, str]]) -> None:
    try:
        q = query.parse(pairs)
    except RedfishError as exc:
        assert exc.status in (400, 501)
        assert exc.messages and exc.messages[0]["MessageId"].startswith("Base.")
        return
    assert q.expand in (None, "*", ".", "~")
    assert 1 <= q.levels <= query.MAX_LEVELS and q.skip >= 0 and (q.top is None or q.top >= 1)


@FUZZ
@given(
    n=st.integers(0, 40),
    skip=st.integers(0, 50),
    top=st.none() | st.integers(1, 50),
    size=st.integers(1, 12),
)
def test_following_next_links_reads_the_asked_window_once(
    n: int, skip: int, top: int | None, size: int
) -> None:
    coll = _collection(n)
    pairs = [("$skip", str(skip))] + ([("$top", str(top))] if top is not None else [])
    read: list[str] = []
    pages = 0
    while True:
        pages += 1
        got = query.page(coll, query.parse(pairs), size)
        assert got["Members@odata.count"] == n and len(got["Members"]) <= size
        read += [m["@odata.id"] for m in got["Members"]]
        link = got.get("Members@odata.nextLink")
        if link is None:
            break
        path, _, qs = link.partition("?")
        assert path == coll["@odata.id"]
        pairs = urllib.parse.parse_qsl(qs)
    end = n if top is None else min(n, skip + top)
    assert read == [m["@odata.id"] for m in coll["Members"][skip:end]]
    assert pages == max(1, -(-max(0, end - skip) // size))


def test_top_and_skip_are_refused_on_a_single_resource() -> None:
    with pytest.raises(RedfishError) as refused:
        query.page({"@odata.id": f"{ROOT}/Systems/a"}, query.Query(top=1), 10)
    assert refused.value.status == 400


def test_expand_inlines_the_links_each_option_selects() -> None:
    docs = {f"{ROOT}/A": {"@odata.id": f"{ROOT}/A", "B": {"@odata.id": f"{ROOT}/B"}}}
    docs[f"{ROOT}/B"] = {"@odata.id": f"{ROOT}/B", "Id": "B"}
    payload = {
        "@odata.id": f"{ROOT}/X",
        "Members": [{"@odata.id": f"{ROOT}/A"}, {"@odata.id": f"{ROOT}/gone"}],
        "Links": {"Peer": {"@odata.id": f"{ROOT}/B"}},
    }
    dot = query.expand(payload, ".", 1, docs.get)
    assert dot["Members"] == [docs[f"{ROOT}/A"], {"@odata.id": f"{ROOT}/gone"}]
    assert dot["Links"] == payload["Links"]
    assert query.expand(payload, "~", 1, docs.get)["Links"]["Peer"] == docs[f"{ROOT}/B"]
    assert query.expand(payload, "~", 1, docs.get)["Members"] == payload["Members"]
    star = query.expand(payload, "*", 1, docs.get)
    assert star["Links"]["Peer"] == docs[f"{ROOT}/B"] and star["Members"][0] == docs[f"{ROOT}/A"]
    two = query.expand(payload, ".", 2, docs.get)
    assert two["Members"][0]["B"] == docs[f"{ROOT}/B"]  # the inlined A's own link, inlined
    assert query.expand(payload, None, 1, docs.get) is payload


@pytest.fixture(scope="module")
def paged() -> Iterator[EmulatorProcess]:
    with EmulatorProcess(extra_args=["--page-size", "4"]) as emu:
        yield emu


def test_a_paged_expanded_collection_reads_every_member_once(paged: EmulatorProcess) -> None:
    client = Client(paged.url)
    root = client.get(f"{ROOT}/").json()["ProtocolFeaturesSupported"]
    assert root["ExpandQuery"]["NoLinks"] and root["ExpandQuery"]["MaxLevels"] == 2
    assert root["TopSkipQuery"]
    plain = client.get(BLOCKS).json()
    assert plain["Members@odata.count"] == 11  # 8 GPU blocks and 3 systems' blocks
    assert len(plain["Members"]) == 4 and plain["Members@odata.nextLink"]
    link: str | None = f"{BLOCKS}?$expand=.($levels=2)"
    members: list[dict[str, Any]] = []
    requests = 0
    while link is not None:
        page = client.get(link)
        assert page.status_code == 200, page.text
        requests += 1
        members += page.json()["Members"]
        link = page.json().get("Members@odata.nextLink")
    assert requests == 3
    ids = [m["@odata.id"] for m in members]
    assert len(ids) == len(set(ids)) == 11
    gpu = next(m for m in members if m["Id"] == "gpu-1")
    alone = client.get(f"{BLOCKS}/gpu-1").json()
    assert {k: v for k, v in gpu.items() if k != "Processors"} == {
        k: v for k, v in alone.items() if k != "Processors"
    }
    assert gpu["Processors"][0] == client.get(f"{BLOCKS}/gpu-1/Processors/GPU0").json()


def test_refused_queries_over_http(paged: EmulatorProcess) -> None:
    client = Client(paged.url)
    unsupported = client.get(f"{ROOT}/Systems?$filter=Id eq 'node-1'")
    assert unsupported.status_code == 501
    assert message_ids(unsupported) == ["Base.1.19.QueryParameterUnsupported"]
    on_resource = client.get(f"{ROOT}/Systems/node-1?$top=1")
    assert on_resource.status_code == 400
    assert message_ids(on_resource) == ["Base.1.19.QueryNotSupportedOnResource"]
    assert client.get(f"{ROOT}/Systems?only").status_code == 200  # no "$": ignored
