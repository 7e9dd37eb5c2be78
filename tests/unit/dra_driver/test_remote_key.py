"""The names a remote device of a claim gets: by pool and device, from checked names."""

from __future__ import annotations

import os
import re
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver import cdi
from dra_driver.checkpoint import PreparedDevice, RemoteLeaseRecord
from dra_driver.claimref import InvalidClaimRef
from dra_driver.remote_key import RemoteKey, recorded_key

_labels = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
_pools = st.lists(_labels, min_size=1, max_size=3).map(".".join)
_hostile = st.one_of(
    st.text(max_size=30),
    st.text(alphabet=string.ascii_letters + string.digits + "-._/\\\x00", max_size=30),
    st.sampled_from(["..", ".", "/", "", "a/../..", "a_b"]),
)
CDI_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*[A-Za-z0-9]")


@settings(max_examples=200)
@given(a=st.tuples(_pools, _labels), b=st.tuples(_pools, _labels))
def test_distinct_pool_and_device_pairs_never_share_a_name(
    a: tuple[str, str], b: tuple[str, str]
) -> None:
    ka, kb = RemoteKey("u-1", *a), RemoteKey("u-1", *b)
    assert CDI_NAME.fullmatch(ka.cdi_name())
    assert (ka.cdi_name() == kb.cdi_name()) == (a == b)
    assert (ka.parts() == kb.parts()) == (a == b)
    # Never a local device's name (``<claim uid>-<device>``) nor a legacy key's.
    assert ka.cdi_name() != cdi.cdi_device_name("u-1", a[1])


@settings(max_examples=300)
@given(pool=_hostile, device=_hostile)
def test_any_name_is_refused_or_stays_below_the_root(pool: str, device: str) -> None:
    root = Path("/state/remote-gpu")
    try:
        parts = RemoteKey("u-1", pool, device).parts()
    except InvalidClaimRef:
        return
    path = os.path.abspath(root.joinpath(*parts))
    assert path == os.path.join(str(root), "u-1", pool, device)


def remote_device(cdi_id: str) -> PreparedDevice:
    return PreparedDevice(
        request_names=["gpu"],
        pool_name="node-d",
        device_name="gpu-0-remote",
        local_name="gpu-0-remote",
        uuid="",
        cdi_device_ids=[cdi_id],
        remote=RemoteLeaseRecord(donor="node-d", lease=1, endpoint="e:1"),
    )


def test_a_record_keeps_the_key_it_was_prepared_under() -> None:
    new = RemoteKey("u-1", "node-d", "gpu-0-remote")
    assert recorded_key("u-1", remote_device(new.cdi_id())) == new
    old = remote_device(cdi.cdi_device_id("u-1", "gpu-0-remote"))
    legacy = recorded_key("u-1", old)
    assert legacy == RemoteKey("u-1", None, "gpu-0-remote")
    assert legacy.parts() == ("u-1", "gpu-0-remote")
    assert legacy.cdi_id() == old.cdi_device_ids[0]


def test_a_pool_longer_than_a_node_name_is_refused() -> None:
    with pytest.raises(InvalidClaimRef):
        RemoteKey("u-1", "a" * 254, "gpu-0-remote").parts()
    assert RemoteKey("u-1", ".".join(["a" * 63] * 4)[:253], "g").parts()[1].startswith("a")
