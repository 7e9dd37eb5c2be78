"""The remote-GPU variable names: what the plugin writes is what the client reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from composable_dra.model import remote_env
from composable_dra.model.remote_env import RemoteEnvError, indexes, lease_env, names


def test_the_first_lease_also_gets_the_unsuffixed_names() -> None:
    env = lease_env(0, 4, "10.0.0.4:7470", 17, "/run/gpu-0-remote.token")
    assert env == {
        "REMOTE_GPUS": "0,1,2,3",
        "REMOTE_GPU_0_ENDPOINT": "10.0.0.4:7470",
        "REMOTE_GPU_0_LEASE": "17",
        "REMOTE_GPU_0_TOKEN_FILE": "/run/gpu-0-remote.token",
        "REMOTE_GPU_ENDPOINT": "10.0.0.4:7470",
        "REMOTE_GPU_LEASE": "17",
        "REMOTE_GPU_TOKEN_FILE": "/run/gpu-0-remote.token",
    }


def test_a_later_lease_gets_only_its_index_and_the_same_list() -> None:
    env = lease_env(2, 4, "10.0.0.5:7470", 9, "/run/gpu-2-remote.token")
    assert env == {
        "REMOTE_GPUS": "0,1,2,3",
        "REMOTE_GPU_2_ENDPOINT": "10.0.0.5:7470",
        "REMOTE_GPU_2_LEASE": "9",
        "REMOTE_GPU_2_TOKEN_FILE": "/run/gpu-2-remote.token",
    }


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
