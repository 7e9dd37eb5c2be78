"""composable_dra/k8s/derived.py: a value per informer object, derived again only for
objects that were replaced."""

from __future__ import annotations

from composable_dra.k8s.derived import Derived
from composable_dra.k8s.frozen import freeze
from composable_dra.k8s.kube import JSON


def test_only_new_objects_are_derived_again_and_gone_ones_are_dropped() -> None:
    seen: list[str] = []

    def name(obj: JSON) -> str:
        seen.append(obj["metadata"]["name"])
        return str(obj["metadata"]["name"]).upper()

    derived = Derived(name)
    a, b = freeze({"metadata": {"name": "a"}}), freeze({"metadata": {"name": "b"}})
    assert derived.map([a, b]) == ["A", "B"]
    assert derived.map([a, b]) == ["A", "B"] and seen == ["a", "b"]
    b2 = freeze({"metadata": {"name": "b", "resourceVersion": "2"}})  # b replaced
    assert derived.map([a, b2]) == ["A", "B"] and seen == ["a", "b", "b"]
    derived.map([b2])  # a gone: forgotten
    assert derived.map([a, b2]) == ["A", "B"] and seen == ["a", "b", "b", "a"]


def test_an_equal_object_that_is_not_the_same_one_is_derived_again() -> None:
    """Kept by identity, not equality: the informer's objects are frozen and replaced,
    never changed, so identity is what says unchanged."""
    count = [0]

    def one(obj: JSON) -> int:
        count[0] += 1
        return count[0]

    derived = Derived(one)
    assert derived.map([{"x": 1}]) == [1]
    assert derived.map([{"x": 1}]) == [2]
