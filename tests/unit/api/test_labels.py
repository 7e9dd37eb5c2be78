"""Label keys, values and selectors (api.labels), as the API server reads them."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from api.labels import (
    LabelError,
    Requirement,
    key_problem,
    names_something,
    parse_selector,
    value_problem,
)
from testbed import vendor_plugin


def test_nvidias_kubelet_plugin_selector_names_it() -> None:
    reqs = parse_selector(vendor_plugin.SELECTOR)
    assert reqs == [
        Requirement("app.kubernetes.io/name", "=", ("dra-driver-nvidia-gpu",)),
        Requirement("dra-driver-nvidia-gpu-component", "=", ("kubelet-plugin",)),
    ]
    assert names_something(reqs)


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("a = b", [Requirement("a", "=", ("b",))]),
        ("a==b", [Requirement("a", "=", ("b",))]),
        ("a!=b", [Requirement("a", "!=", ("b",))]),
        ("!a", [Requirement("a", "!")]),
        ("a", [Requirement("a", "exists")]),
        (
            "a in (b, c),d notin (e)",
            [Requirement("a", "in", ("b", "c")), Requirement("d", "notin", ("e",))],
        ),
        ("a=", [Requirement("a", "=", ("",))]),
    ],
)
def test_requirements_as_labels_parse_reads_them(
    selector: str, expected: list[Requirement]
) -> None:
    assert parse_selector(selector) == expected


@pytest.mark.parametrize("selector", ["", " ", "!x", "a!=b", "x", "a notin (b)", "a=", "a in (b)"])
def test_selectors_that_match_pods_lacking_a_label_name_nothing(selector: str) -> None:
    assert not names_something(parse_selector(selector))


@pytest.mark.parametrize(
    "selector", ['a="b"', "a=b=c", "a,", "x>1", "a in ()", "A/b=c", "a=b\\", "a=-b", "a in (b"]
)
def test_malformed_selectors_are_refused(selector: str) -> None:
    with pytest.raises(LabelError):
        parse_selector(selector)


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("team", True),
        ("example.com/team", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("/team", False),
        ("Example.com/team", False),
        ("team/", False),
        ("-team", False),
        ("te am", False),
        ("a/b/c", False),
    ],
)
def test_label_keys(key: str, ok: bool) -> None:
    assert (key_problem(key) is None) == ok


@pytest.mark.parametrize(
    ("value", "ok"),
    [("", True), ("a.b-c_d", True), ("a" * 64, False), ("b-", False), ("a\n", False)],
)
def test_label_values(value: str, ok: bool) -> None:
    assert (value_problem(value) is None) == ok


@settings(max_examples=400)
@given(
    selector=st.text(alphabet=st.sampled_from('ab./_=!,() -in"\\\n'), max_size=24)
    | st.text(max_size=16)
)
@example(selector="a in (b,c=d)")
def test_fuzz_parse_selector(selector: str) -> None:
    """Any text: requirements whose keys and values are valid, or a LabelError."""
    try:
        reqs = parse_selector(selector)
    except LabelError:
        return
    for r in reqs:
        assert key_problem(r.key) is None
        assert all(value_problem(v) is None for v in r.values)
