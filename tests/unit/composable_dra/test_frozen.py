"""composable_dra.k8s.frozen: cached JSON that refuses changes and still reads as JSON."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from composable_dra.k8s.frozen import FrozenDict, FrozenList, ReadOnlyError, freeze, thaw

OBJ = {"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"devices": [{"n": 1}, 2]}}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(json_values)
def test_frozen_json_reads_encodes_and_copies_as_the_original(value: Any) -> None:
    frozen = freeze(value)
    assert frozen == value
    assert json.dumps(frozen, sort_keys=True) == json.dumps(value, sort_keys=True)
    plain = copy.deepcopy(frozen)
    assert plain == value and not isinstance(plain, FrozenDict | FrozenList)


@pytest.mark.parametrize(
    "change",
    [
        lambda o: o.__setitem__("x", 1),
        lambda o: o.pop("spec"),
        lambda o: o.update(x=1),
        lambda o: o.setdefault("status", {}),
        lambda o: o.clear(),
        lambda o: o["metadata"]["labels"].__delitem__("x"),
        lambda o: o["spec"]["devices"].append(3),
        lambda o: o["spec"]["devices"].sort(key=str),
        lambda o: o["spec"]["devices"][0].__setitem__("n", 2),
        lambda o: o["spec"]["devices"].__iadd__([3]),
    ],
)
def test_every_change_in_place_raises(change: Callable[[Any], object]) -> None:
    frozen = freeze(OBJ)
    with pytest.raises(ReadOnlyError):
        change(frozen)
    assert frozen == OBJ


def test_thaw_and_shallow_copies_give_changeable_containers() -> None:
    frozen = freeze(OBJ)
    plain = thaw(frozen)
    plain["spec"]["devices"].append(3)
    top = copy.copy(frozen)
    top["status"] = {}
    assert frozen == OBJ and type(top) is dict
