"""Who a TokenReview names, and who is a node's plugin: the lease API's authorization."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.lending.remote_leases import (
    DONORS_AUDIENCE,
    NODE_NAME_EXTRA,
    POD_NAME_EXTRA,
    Code,
    FileToken,
    LeaseAPIError,
    audience,
)
from remote_gpu.identity import Identity, identity_of, is_plugin_on

PLUGIN = "system:serviceaccount:cdra:plugin"
AUDS = (audience("donor-a"), DONORS_AUDIENCE)


def review(auds: list[str], extra: dict[str, Any], user: str = PLUGIN) -> dict[str, Any]:
    """A TokenReview status as v1.37.1 answers for a token bound to a pod."""
    return {
        "authenticated": True,
        "audiences": auds,
        "user": {"username": user, "extra": extra},
    }


POD_BOUND = {NODE_NAME_EXTRA: ["node-c"], POD_NAME_EXTRA: ["plugin-x"], "x": ["y"]}


def test_a_pod_bound_token_for_either_audience_names_its_node_and_pod() -> None:
    for aud in AUDS:
        assert identity_of(review([aud], POD_BOUND), AUDS) == Identity(PLUGIN, "node-c", "plugin-x")
    with pytest.raises(LeaseAPIError) as err:
        identity_of(review([audience("donor-b")], POD_BOUND), AUDS)
    assert err.value.code is Code.UNAUTHENTICATED
    with pytest.raises(LeaseAPIError):
        identity_of({"authenticated": False, "audiences": list(AUDS)}, AUDS)


def test_only_a_token_bound_to_a_pod_on_the_node_is_its_plugin() -> None:
    assert is_plugin_on(Identity(PLUGIN, "node-c", "plugin-x"), PLUGIN, "node-c")
    assert not is_plugin_on(Identity(PLUGIN, "node-c", "plugin-x"), PLUGIN, "node-d")
    assert not is_plugin_on(Identity(PLUGIN, "node-c"), PLUGIN, "node-c")  # the Node only
    assert not is_plugin_on(Identity(PLUGIN), PLUGIN, "node-c")
    assert not is_plugin_on(Identity("system:serviceaccount:x:y", "node-c", "p"), PLUGIN, "node-c")
    # Two node names (no API server sends them) name none.
    twice = review([DONORS_AUDIENCE], {NODE_NAME_EXTRA: ["a", "b"], POD_NAME_EXTRA: ["p"]})
    assert identity_of(twice, AUDS).node is None


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
STATUS = st.fixed_dictionaries(
    {},
    optional={
        "authenticated": st.booleans() | JSONISH,
        "audiences": st.lists(st.sampled_from([*AUDS, "other"]), max_size=3) | JSONISH,
        "user": st.fixed_dictionaries(
            {},
            optional={
                "username": st.text(max_size=20) | JSONISH,
                "extra": st.dictionaries(
                    st.sampled_from([NODE_NAME_EXTRA, POD_NAME_EXTRA, "x"]), JSONISH
                )
                | JSONISH,
            },
        ),
    },
)


@settings(max_examples=200)
@given(STATUS)
def test_identity_of_fuzz(status: dict[str, Any]) -> None:
    """Whatever the status holds, a typed refusal or an identity of strings."""
    try:
        who = identity_of(status, AUDS)
    except LeaseAPIError as exc:
        assert exc.code is Code.UNAUTHENTICATED
        return
    except (AttributeError, TypeError):
        pytest.fail(f"untyped failure on {status!r}")
    assert isinstance(who.user, str)
    assert who.node is None or isinstance(who.node, str)


def test_the_plugins_token_file_is_read_at_each_call(tmp_path: Path) -> None:
    path = tmp_path / "token"
    tokens = FileToken(path)
    with pytest.raises(LeaseAPIError) as err:
        tokens.token(audience("donor-a"))
    assert err.value.code is Code.UNAVAILABLE
    path.write_text("first.jwt.token\n")
    assert tokens.token(audience("donor-a")) == "first.jwt.token"
    path.write_text("renewed.jwt.token")  # the kubelet renewed it
    assert tokens.token(audience("donor-b")) == "renewed.jwt.token"
    for bad in (b"", b"two words", b"\xff\xfe", b"x" * 9000):
        path.write_bytes(bad)
        with pytest.raises(LeaseAPIError):
            tokens.token(DONORS_AUDIENCE)
