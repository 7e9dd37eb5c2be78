"""The shared pieces that each replaced several copies: ClaimRef, RFC 3339 times, conditions."""

from __future__ import annotations

import datetime
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api.v1alpha1 import ClaimRef, ComposableResourceSpec
from composable_dra.k8s.conditions import MESSAGE_LIMIT, condition, find
from composable_dra.k8s.timestamps import format_time, now_rfc3339, parse_time


def test_claim_ref_is_one_hashable_value_built_either_way() -> None:
    a = ClaimRef("ns", "c1", "uid-1")
    b = ClaimRef(namespace="ns", name="c1", uid="uid-1")
    assert a == b and len({a, b}) == 1
    with pytest.raises((AttributeError, TypeError, ValidationError)):
        a.name = "other"  # type: ignore[misc]


def test_claim_ref_refuses_empty_and_overlong_parts() -> None:
    with pytest.raises(ValidationError):
        ClaimRef("", "c1", "uid-1")
    with pytest.raises(ValidationError):
        ClaimRef("ns", "c1", "u" * 65)


def test_the_custom_resource_reads_its_claim_ref_as_the_shared_type() -> None:
    spec = ComposableResourceSpec.model_validate(
        {
            "fabric": "f",
            "deviceID": "blk-1",
            "targetNode": "n1",
            "claimRef": {"namespace": "ns", "name": "c1", "uid": "u1"},
        }
    )
    assert spec.claim_ref == ClaimRef("ns", "c1", "u1")
    assert spec.model_dump(by_alias=True)["claimRef"] == {
        "namespace": "ns",
        "name": "c1",
        "uid": "u1",
    }


@settings(max_examples=200)
@given(st.integers(min_value=0, max_value=4_102_444_800))  # up to 2100
def test_times_round_trip_in_the_apis_format(seconds: int) -> None:
    text = format_time(seconds)
    assert len(text) == 20 and text.endswith("Z") and text[10] == "T"
    assert parse_time(text) == seconds


def test_now_is_utc_whole_seconds() -> None:
    before = int(time.time())
    stamp = parse_time(now_rfc3339())
    assert stamp is not None and before <= stamp <= time.time()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, None),
        ("", None),
        ("yesterday", None),
        ("2026-01-02T03:04:05+01:00", datetime.datetime(2026, 1, 2, 2, 4, 5, tzinfo=datetime.UTC)),
        (
            "2026-01-02T03:04:05.5Z",
            datetime.datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=datetime.UTC),
        ),
        ("2026-01-02T03:04:05", datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)),
    ],
)
def test_parse_time_reads_offsets_and_refuses_garbage(
    text: str | None, expected: datetime.datetime | None
) -> None:
    assert parse_time(text) == (expected.timestamp() if expected else None)


def test_a_condition_carries_its_time_and_a_bounded_message() -> None:
    c = condition("Ready", False, "Detaching", "x" * 5000, at=0)
    assert c == {
        "type": "Ready",
        "status": "False",
        "reason": "Detaching",
        "message": "x" * MESSAGE_LIMIT,
        "lastTransitionTime": "1970-01-01T00:00:00Z",
    }
    assert condition("Attached", True, "Attached", "ok")["status"] == "True"


def test_find_picks_a_condition_by_type() -> None:
    conds = [condition("A", True, "r", "m", at=0), condition("B", False, "r", "m", at=0)]
    assert find(conds, "B") == conds[1]
    assert find(conds, "C") is None and find(None, "A") is None
