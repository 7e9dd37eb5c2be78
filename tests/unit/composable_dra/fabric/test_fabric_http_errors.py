"""composable_dra.fabric.http_errors: a failed HTTP answer as a typed FabricError."""

from __future__ import annotations

import pytest

from composable_dra.fabric import errors as fe
from composable_dra.fabric.http_errors import answer_error, status_error

BY_CODE = {"InUse": fe.InUseError, "Short": fe.InsufficientError}


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, fe.AuthError),
        (403, fe.AuthError),
        (404, fe.NotFoundError),
        (409, fe.InUseError),
        (429, fe.BusyError),
        (503, fe.BusyError),
        (500, fe.TransientError),
        (400, fe.OperationFailedError),
    ],
)
def test_the_status_alone(status: int, kind: type[fe.FabricError]) -> None:
    assert type(status_error(status, "m", None)) is kind
    assert type(answer_error(status, {}, "GET /x", "t", ["Other"], BY_CODE)) is kind


def test_the_first_known_code_says_more_than_the_status() -> None:
    err = answer_error(409, {}, "POST /a", "out of GPUs", ["Other", "Short", "InUse"], BY_CODE)
    assert type(err) is fe.InsufficientError
    assert str(err) == "POST /a: HTTP 409: out of GPUs"


def test_a_busy_answer_carries_its_retry_after_and_an_absurd_one_is_a_bad_answer() -> None:
    busy = answer_error(503, {"retry-after": "2"}, "GET /x", "t", [], BY_CODE)
    assert type(busy) is fe.BusyError and busy.retry_after == 2.0
    with pytest.raises(fe.BadAnswerError, match="GET /x: Retry-After"):
        answer_error(429, {"retry-after": "999999999"}, "GET /x", "t", [], BY_CODE)
