"""A failed HTTP answer as a typed FabricError: the one reading that the HTTP backends
(Redfish, Fsas) share. Each reads its own answer's message and codes (redfish.py,
fsas_answers.py); what they mean is decided here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from composable_dra.fabric.errors import (
    AuthError,
    BusyError,
    FabricError,
    InUseError,
    NotFoundError,
    OperationFailedError,
    TransientError,
)
from composable_dra.fabric.retry_after import busy_wait


def status_error(status: int, message: str, retry_after: float | None) -> FabricError:
    """The typed error an HTTP status alone says (when the answer's body said nothing
    more precise)."""
    if status in (401, 403):
        return AuthError(message)
    if status == 404:
        return NotFoundError(message)
    if status == 409:
        return InUseError(message)
    if status in (429, 503):
        return BusyError(message, retry_after=retry_after)
    if status >= 500:
        return TransientError(message)
    return OperationFailedError(message)


# A fabric's own error codes (a Redfish MessageId's last part, an FM's detail.code) whose
# meaning the status alone does not carry.
Codes = Mapping[str, type[FabricError]]


def answer_error(
    status: int, headers: Mapping[str, str], what: str, text: str, codes: Iterable[str], by: Codes
) -> FabricError:
    """The error a failed answer to ``what`` means (``text``: its own words): that of the
    first of its ``codes`` that ``by`` knows (a status alone is ambiguous: a 409 may be a
    device in use or a fabric out of capacity), else the status's. A busy answer (429,
    503) carries the wait its Retry-After asks for; BadAnswerError for an absurd one."""
    message = f"{what}: HTTP {status}: {text}"
    retry_after = busy_wait(status, headers, what)
    known = next((by[c] for c in codes if c in by), None)
    if known is not None:
        return known(message, retry_after=retry_after)
    return status_error(status, message, retry_after)
