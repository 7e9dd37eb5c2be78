"""The remote-GPU variable names: what the plugin writes is what the client reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composable_dra.model import remote_env
from composable_dra.model.remote_env import RemoteEnvError, indexes, lease_env, names

# The lease's directory is mounted at /d; its token file is in it.
FIRST = {
    "REMOTE_GPU_0_ENDPOINT": "h:1",
    "REMOTE_GPU_0_LEASE": "17",
    "REMOTE_GPU_0_TOKEN_FILE": "/d/token",
    "REMOTE_GPU_0_DIR": "/d",
    # The first lease keeps the names RemoteGPU.from_env() has always read.
    "REMOTE_GPU_ENDPOINT": "h:1",
    "REMOTE_GPU_LEASE": "17",
    "REMOTE_GPU_TOKEN_FILE": "/d/token",
    "REMOTE_GPU_DIR": "/d",
}
LATER = {
    "REMOTE_GPU_2_ENDPOINT": "h:1",
    "REMOTE_GPU_2_LEASE": "17",
    "REMOTE_GPU_2_TOKEN_FILE": "/d/token",
    "REMOTE_GPU_2_DIR": "/d",
}


@pytest.mark.parametrize(("index", "names_set"), [(0, FIRST), (2, LATER)])
def test_each_lease_gets_its_index_and_the_list_and_the_first_the_unsuffixed_names(
    index: int, names_set: dict[str, str]
) -> None:
    assert lease_env(index, 4, "h:1", 17, "/d") == {"REMOTE_GPUS": "0,1,2,3", **names_set}


def test_merged_edits_of_a_claim_never_conflict_and_list_every_lease() -> None:
    merged: dict[str, str] = {}
    for i in range(4):
        for k, v in lease_env(i, 4, f"h{i}:1", i + 1, f"/t{i}").items():
            assert merged.setdefault(k, v) == v, k
    assert indexes(merged) == [0, 1, 2, 3]
    assert [merged[names(i).lease] for i in indexes(merged)] == ["1", "2", "3", "4"]


def test_indexes_of_a_plugin_before_several_leases_and_of_none() -> None:
    assert indexes({"REMOTE_GPU_ENDPOINT": "h:1"}) == [None]
    assert indexes({}) == []
    assert names(None).endpoint == "REMOTE_GPU_ENDPOINT"


@pytest.mark.parametrize("bad", ["", "0,", "a", "0,0", "1,-2", "0;1", "64", " 0"])
def test_a_list_that_does_not_parse_is_a_typed_error(bad: str) -> None:
    with pytest.raises(RemoteEnvError, match="REMOTE_GPUS"):
        indexes({"REMOTE_GPUS": bad})


@given(st.text(max_size=200))
def test_any_list_is_indexes_or_a_typed_error(text: str) -> None:
    try:
        out = indexes({remote_env.LIST: text})
    except RemoteEnvError:
        return
    assert out and all(isinstance(i, int) and 0 <= i < remote_env.MAX_LEASES for i in out)
    assert len(set(out)) == len(out)


def test_the_endpoint_file_round_trips_and_names_its_lease() -> None:
    data = remote_env.endpoint_file("10.0.0.4:7470", 17)
    assert remote_env.read_endpoint_file(data) == ("10.0.0.4:7470", 17)


@pytest.mark.parametrize(
    "bad",
    [b"", b"[]", b"{", b'{"endpoint": "h:1"}', b'{"endpoint": "", "lease": 1}',
     b'{"endpoint": "h:1", "lease": 0}', b'{"endpoint": "h:1", "lease": true}',
     b'{"endpoint": 1, "lease": 1}', b"x" * 5000],
)  # fmt: skip
def test_an_endpoint_file_that_does_not_parse_is_a_typed_error(bad: bytes) -> None:
    with pytest.raises(RemoteEnvError):
        remote_env.read_endpoint_file(bad)


@given(st.binary(max_size=300))
def test_any_endpoint_file_is_a_lease_or_a_typed_error(data: bytes) -> None:
    try:
        endpoint, lease = remote_env.read_endpoint_file(data)
    except RemoteEnvError:
        return
    assert endpoint and 0 < lease < 1 << 64
